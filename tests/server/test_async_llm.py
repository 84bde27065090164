"""``AsyncLLM`` used in-process: generate, abort, and ``stat_loggers=[...]``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from forkless import AsyncLLM, SamplingParams
from forkless.config import EngineArgs
from forkless.metrics import StatLoggerBase


class CollectingLogger(StatLoggerBase):
    def __init__(self, config, engine_index: int = 0) -> None:
        super().__init__(config, engine_index)
        self.initialized = 0
        self.generated = 0
        self.finished: list[str] = []
        self.saw_scheduler_stats = False

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0) -> None:
        self.saw_scheduler_stats |= scheduler_stats is not None
        if iteration_stats is not None:
            self.generated += iteration_stats.num_generation_tokens
            self.finished += [f.finish_reason for f in iteration_stats.finished_requests]

    def log_engine_initialized(self) -> None:
        self.initialized += 1


def test_async_llm_generate_abort_and_stat_loggers(tiny_llama: Path) -> None:
    instance = CollectingLogger(None)

    async def main() -> tuple[list[str], int]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20,
                          distributed_executor_backend="mp")
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[CollectingLogger, instance], log_stats=False)
        try:
            await llm.start()
            texts = []
            for i in range(2):
                params = SamplingParams(temperature=0, max_tokens=5)
                async for out in llm.generate("Hello there", params, request_id=f"r{i}"):
                    final = out
                texts.append(final.outputs[0].text)
                assert final.finished and len(final.outputs[0].token_ids) == 5
            # abort: a long request, cancelled after its first output
            stream = llm.generate("Count", SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), "long")
            async for out in stream:
                break
            await stream.aclose()
            await asyncio.sleep(1.0)
            by_class = next(s for s in llm.stat_loggers if type(s) is CollectingLogger and s is not instance)
            return texts, by_class.initialized
        finally:
            llm.shutdown()

    texts, class_initialized = asyncio.run(main())
    assert texts[0] == texts[1]  # greedy, same prompt
    assert class_initialized == 1 and instance.initialized == 1
    assert instance.saw_scheduler_stats
    assert instance.finished.count("length") == 2
    assert instance.generated >= 10


def test_a_stream_that_falls_behind_gets_the_newest_output(tiny_llama: Path) -> None:
    # Cumulative outputs: a slow reader skips the ones it missed (each holds all before it)
    # and loses nothing; DELTA outputs are never merged away.
    from forkless.sampling_params import RequestOutputKind

    async def main() -> tuple[list[list[int]], list[list[int]], list[int]]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            await llm.start()

            async def read(kind: RequestOutputKind, rid: str) -> list[list[int]]:
                params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, output_kind=kind)
                seen = []
                async for out in llm.generate("Hello there", params, request_id=rid):
                    seen.append(list(out.outputs[0].token_ids))
                    await asyncio.sleep(0.1)  # slower than the engine's steps
                return seen

            reference = []
            async for out in llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=40,
                                                                        ignore_eos=True), request_id="ref"):
                reference = list(out.outputs[0].token_ids)
            return await read(RequestOutputKind.CUMULATIVE, "slow"), await read(RequestOutputKind.DELTA, "delta"), \
                reference
        finally:
            llm.shutdown()

    cumulative, deltas, reference = asyncio.run(main())
    assert len(reference) == 40
    assert cumulative[-1] == reference
    assert len(cumulative) < 20, len(cumulative)  # it skipped outputs it fell behind on
    assert all(a == b[:len(a)] for a, b in zip(cumulative, cumulative[1:]))  # each one cumulative
    assert [t for d in deltas for t in d] == reference  # every delta, in order
