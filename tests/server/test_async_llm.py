"""``AsyncLLM`` used in-process: generate, abort, and ``stat_loggers=[...]``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from forkless import AsyncLLM, SamplingParams
from forkless.config import EngineArgs
from forkless.metrics import StatLoggerBase
from forkless.metrics.stats import RequestStateStats
from tests.server.conftest import until


class CollectingLogger(StatLoggerBase):
    def __init__(self, config, engine_index: int = 0) -> None:
        super().__init__(config, engine_index)
        self.initialized = 0
        self.generated = 0
        self.finished: list[str] = []
        self.phases: list[tuple[float, float, float, float]] = []  # vLLM's queued, prefill, decode, inference
        self.saw_scheduler_stats = False

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0) -> None:
        self.saw_scheduler_stats |= scheduler_stats is not None
        if iteration_stats is not None:
            self.generated += iteration_stats.num_generation_tokens
            self.finished += [f.finish_reason for f in iteration_stats.finished_requests]
            self.phases += [(f.queued_time, f.prefill_time, f.decode_time, f.inference_time)
                            for f in iteration_stats.finished_requests]

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
                wall, mono = time.time(), time.monotonic()
                async for out in llm.generate("Hello there", params, request_id=f"r{i}"):
                    final = out
                wall_end, mono_end = time.time(), time.monotonic()
                texts.append(final.outputs[0].text)
                assert final.finished and len(final.outputs[0].token_ids) == 5
                # As vLLM's AsyncLLM with statistics on (here for the stat loggers given):
                # the request's RequestStateStats, its *_ts from the engine core's events
                # and steps (the monotonic clock, one per host).
                m = final.metrics
                assert isinstance(m, RequestStateStats)
                assert m.num_generation_tokens == 5
                assert wall <= m.arrival_time <= wall_end
                assert 0 < m.first_token_latency <= wall_end - m.arrival_time
                assert mono <= m.queued_ts <= m.scheduled_ts <= m.first_token_ts < m.last_token_ts <= mono_end
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
    # The stat loggers get vLLM's phases of each finished request.
    assert len(instance.phases) == 2
    for queued, prefill, decode, inference in instance.phases:
        assert queued >= 0 and prefill > 0 and decode > 0
        assert abs(inference - (prefill + decode)) < 1e-9


def test_abort_beside_a_stream_ends_it_and_frees_the_id(tiny_llama: Path) -> None:
    """vLLM's ``AsyncLLM.abort(request_id)`` from another task than the one reading the
    request's stream: the stream ends, with a last output whose unfinished completions
    say ``"abort"`` (vLLM's), whatever the output kind and ``n``; nothing stays in
    flight. An id is free again once its request has ended, even while its old stream
    has not read that end yet: the old stream's close leaves the new request alone."""
    from forkless.sampling_params import RequestOutputKind

    async def main() -> None:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            await llm.start()
            for kind, n in ((RequestOutputKind.CUMULATIVE, 1), (RequestOutputKind.DELTA, 2),
                            (RequestOutputKind.FINAL_ONLY, 2)):
                params = SamplingParams(top_k=1, max_tokens=200, ignore_eos=True, n=n, output_kind=kind)
                outs: list = []

                async def read() -> None:
                    async for out in llm.generate("Count", params, "long"):
                        outs.append(out)

                reader = asyncio.create_task(read())
                if kind is RequestOutputKind.FINAL_ONLY:  # (no output before the end)
                    await until(llm.output_processor.has_unfinished_requests)
                else:  # every sequence has a token (a delta may carry one sequence's only)
                    await until(lambda: {c.index for o in outs for c in o.outputs if c.token_ids} == set(range(n)))
                await llm.abort("long")
                await asyncio.wait_for(reader, 10)  # a stream left waiting fails here
                last = outs[-1]
                assert last.finished and [c.finish_reason for c in last.outputs] == ["abort"] * n, (kind, last)
                if kind is RequestOutputKind.DELTA:
                    lengths = [sum(len(c.token_ids) for o in outs for c in o.outputs if c.index == i)
                               for i in range(n)]
                else:
                    lengths = [len(c.token_ids) for c in last.outputs]
                assert all(k < 200 for k in lengths) and (kind is RequestOutputKind.FINAL_ONLY
                                                          or all(lengths)), (kind, lengths)
                assert llm.num_requests_in_flight == 0 and not llm.output_processor.has_unfinished_requests()

            short = SamplingParams(temperature=0, max_tokens=3)

            async def final(stream, last: object = None) -> object:
                async for out in stream:
                    last = out
                return last

            old = llm.generate("Hello", short, "again")
            first = await old.__anext__()
            # It finishes; its last output waits for the old stream.
            await until(lambda: not llm.output_processor.has_unfinished_requests())
            # Long enough to be seen running (a fast host ran 20 tokens between two polls);
            # should it end first all the same, the old stream's close below must still leave
            # its output whole.
            longer = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            new = asyncio.create_task(final(llm.generate("Hello", longer, "again")))
            await until(lambda: llm.output_processor.has_unfinished_requests() or new.done())  # the new one runs
            old_final = await final(old, first)  # the old stream reads its end, and closes
            new_final = await asyncio.wait_for(new, 10)
            assert old_final.finished and new_final.finished
            tokens = new_final.outputs[0].token_ids
            assert len(tokens) == 200 and tokens[:3] == old_final.outputs[0].token_ids
            assert llm.num_requests_in_flight == 0
        finally:
            llm.shutdown()

    asyncio.run(main())


def test_send_puts_requests_in_the_engine_before_their_streams_are_read(tiny_llama: Path) -> None:
    """``AsyncLLM.send``: the requests run before anyone reads their streams, which then
    read the same outputs; a sent stream closed, or dropped, unread aborts its request; a
    beam search passes through (it sends as it runs); a refused send closes them all."""
    import gc

    from forkless.engine.async_llm import EngineShuttingDownError, gather_streams
    from forkless.sampling_params import BeamSearchParams

    async def final(stream) -> object:
        async for out in stream:
            last = out
        return last

    async def main() -> None:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            await llm.start()
            params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
            lazy = await final(llm.generate("Hello there", params, "lazy"))
            sent = [llm.generate("Hello there", params, f"sent{i}") for i in range(2)]
            await llm.send(sent)
            # Both finish in the engine while nobody reads them.
            await until(lambda: not llm.output_processor.has_unfinished_requests())
            for stream in sent:
                out = await final(stream)
                assert out.finished and out.outputs[0].token_ids == lazy.outputs[0].token_ids
            assert llm.num_requests_in_flight == 0

            long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            closed = llm.generate("Count", long, "closed")
            dropped = llm.generate("Count", long, "dropped")
            await llm.send([closed, dropped])
            assert llm.num_requests_in_flight == 2
            await closed.aclose()
            del dropped
            gc.collect()  # asyncio's finalizer closes a started stream nobody holds
            await until(lambda: llm.num_requests_in_flight == 0
                        and not llm.output_processor.has_unfinished_requests(), timeout=10)

            # gather_streams (a pooling request's inputs, a beam step's beams, a constrained
            # request's choices): when one stream's reader fails, the others are aborted
            # at once, not left to run to their 200 tokens.
            siblings = [llm.generate("Count", long, f"sibling{i}") for i in range(3)]
            await llm.send(siblings)

            async def read_or_fail(stream) -> object:
                async for out in stream:
                    if stream is siblings[1] and out.outputs[0].token_ids:
                        raise RuntimeError("the second sibling failed")
                    last = out
                return last

            try:
                await gather_streams(siblings, read_or_fail)
                raise AssertionError("the failure was not raised")
            except RuntimeError as exc:
                assert "second sibling" in str(exc)
            assert llm.num_requests_in_flight == 0
            await until(lambda: not llm.output_processor.has_unfinished_requests(), timeout=10)

            beams = llm.beam_search({"prompt": "Hello"}, "beam", BeamSearchParams(beam_width=2, max_tokens=3))
            await llm.send([beams])
            assert len((await final(beams)).outputs) == 2

            refused = [llm.generate("Hello", params, f"refused{i}") for i in range(2)]
            llm.abort_in_flight("the test ends the engine's requests")
            try:
                await llm.send(refused)
                raise AssertionError("send went through a shutdown")
            except EngineShuttingDownError:
                pass
            assert llm.num_requests_in_flight == 0
        finally:
            llm.shutdown()

    asyncio.run(main())


def test_the_first_requests_start_the_engine_as_vllm_s_asyncllm_is_used(tiny_llama: Path) -> None:
    # vLLM's recipe: AsyncLLM.from_engine_args(...) and generate at once; requests that
    # arrive together share one start.
    async def main() -> list[str]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20,
                          distributed_executor_backend="mp")
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            async def one(i: int) -> str:
                async for out in llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=4), f"r{i}"):
                    final = out
                return final.outputs[0].text

            return list(await asyncio.gather(one(0), one(1), one(2)))
        finally:
            llm.shutdown()

    texts = asyncio.run(main())
    assert len(set(texts)) == 1 and texts[0]


def test_a_stream_that_falls_behind_gets_the_newest_output(tiny_llama: Path) -> None:
    # Cumulative outputs: a slow reader skips the ones it missed (each holds all before it)
    # and loses nothing; the DELTA outputs it missed arrive merged into one, so it gets
    # fewer outputs than steps and their concatenation is the whole text.
    from forkless.sampling_params import RequestOutputKind

    texts: dict = {}
    events: list = []

    async def main() -> tuple[list[list[int]], list[list[int]], list[int]]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            await llm.start()
            # Statistics off (no stat loggers either): the engine core records no request
            # events, and no output gets metrics (vLLM's AsyncLLM without log_stats).
            processor = llm.output_processor
            process_outputs = processor.process_outputs

            def watch(outputs, *args, **kwargs):
                outputs = list(outputs)
                events.extend(out.events for out in outputs)
                return process_outputs(outputs, *args, **kwargs)

            processor.process_outputs = watch

            async def read(kind: RequestOutputKind, rid: str) -> list[list[int]]:
                params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, output_kind=kind)
                seen = []
                async for out in llm.generate("Hello there", params, request_id=rid):
                    assert out.metrics is None
                    seen.append(list(out.outputs[0].token_ids))
                    texts.setdefault(kind, []).append(out.outputs[0].text)
                    await asyncio.sleep(0.1)  # slower than the engine's steps
                return seen

            reference = []
            async for out in llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=40,
                                                                        ignore_eos=True), request_id="ref"):
                reference = list(out.outputs[0].token_ids)
                texts["ref"] = [out.outputs[0].text]
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
    assert len(deltas) < 20, len(deltas)  # the ones it fell behind on came merged
    assert "".join(texts[RequestOutputKind.DELTA]) == texts["ref"][0] == texts[RequestOutputKind.CUMULATIVE][-1]
    assert len(events) >= 40 and all(e is None for e in events)  # the engine core recorded nothing


def _same(a, b, tol: float = 1e-3) -> bool:
    """Equal, logprobs within ``tol``: a run that hits the prefix cache, or batches its rows
    otherwise, may differ in the 5th decimal (rounding both sides to 3 decimals failed
    where a value sat on a rounding boundary: -8.4885 gave -8.489 and -8.488)."""
    if a == b:
        return True
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], tol) for k in a)
    return False


def _sse_events(chunks: list[str]) -> list:
    import json

    events = []
    for chunk in chunks:
        for line in chunk.split("\n\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    assert chunks[-1].endswith("data: [DONE]\n\n")
    return events


def test_openai_streams_that_fall_behind_send_the_same_choices(tiny_llama: Path) -> None:
    # The server streams DELTA outputs; a reader slower than the engine gets the steps it
    # missed merged. What the client sees, joined per choice, must not depend on that:
    # text, tokens, logprobs, text_offset (echo included), finish and stop reasons, usage;
    # and it must equal the non-streaming answer. n > 1, two prompts, a stop string held
    # back, chat with logprobs.
    from forkless.entrypoints.openai.serving import OpenAIServing
    from forkless.protocol.openai import ChatCompletionRequest, CompletionRequest

    completion = dict(prompt="Hello there", n=2, max_tokens=48, top_k=1,
                      logprobs=2, echo=True, stop=[" the", "ing"], include_stop_str_in_output=False)
    completion2 = dict(completion, prompt=["Hello there", "The capital of France"])
    chat = dict(messages=[{"role": "user", "content": "Say something"}], n=2, max_tokens=48, top_k=1,
                logprobs=True, top_logprobs=2, stop=["ing"])
    usage = {"stream_options": {"include_usage": True}}  # only with stream=true

    async def read(stream, delay: float) -> list[str]:
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            await asyncio.sleep(delay)
        return chunks

    async def main() -> dict:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        results: dict = {}
        try:
            await llm.start()
            serving = OpenAIServing(llm, ["tiny"], max_model_len=256)
            for delay in (0.0, 0.03):
                results["cmpl", delay] = await read(await serving.create_completion(
                    CompletionRequest(stream=True, **completion, **usage), None), delay)
                # Several prompts: each stream is pumped into one queue, so nothing merges
                # (as before), but the chunks must be right too.
                results["cmpl2", delay] = await read(await serving.create_completion(
                    CompletionRequest(stream=True, **completion2, **usage), None), delay)
                results["chat", delay] = await read(await serving.create_chat_completion(
                    ChatCompletionRequest(stream=True, **chat, **usage), None), delay)
            results["cmpl"] = await serving.create_completion(CompletionRequest(**completion), None)
            results["cmpl2"] = await serving.create_completion(CompletionRequest(**completion2), None)
            results["chat"] = await serving.create_chat_completion(ChatCompletionRequest(**chat), None)
        finally:
            llm.shutdown()
        return results

    results = asyncio.run(main())

    def joined_completions(events: list) -> tuple[dict, dict]:
        choices: dict = {}
        for e in events[:-1]:
            (c,) = e["choices"]
            got = choices.setdefault(c["index"], {"text": "", "finish": [], "stop": None, "tokens": [],
                                                  "token_logprobs": [], "top_logprobs": [], "text_offset": []})
            got["text"] += c["text"]
            if c["finish_reason"] is not None:
                got["finish"].append(c["finish_reason"])
                got["stop"] = c["stop_reason"]
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                got[key] += c["logprobs"][key]
        return choices, events[-1]["usage"]

    for key, indices in (("cmpl", [0, 1]), ("cmpl2", [0, 1, 2, 3])):
        fast, fast_usage = joined_completions(_sse_events(results[key, 0.0]))
        slow, slow_usage = joined_completions(_sse_events(results[key, 0.03]))
        if key == "cmpl":  # the slow reader got merged outputs
            assert len(results[key, 0.03]) < len(results[key, 0.0])
        assert _same(fast, slow) and fast_usage == slow_usage
        whole = results[key]
        assert sorted(fast) == [c.index for c in whole.choices] == indices
        for c in whole.choices:
            got = fast[c.index]
            assert got["finish"] == [c.finish_reason] and got["stop"] == c.stop_reason
            assert got["text"] == c.text
            lp = c.logprobs.model_dump()
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert _same(got[name], lp[name]), name
        assert (fast_usage["prompt_tokens"], fast_usage["completion_tokens"]) == (
            whole.usage.prompt_tokens, whole.usage.completion_tokens)

    def joined_chat(events: list) -> tuple[dict, dict]:
        choices: dict = {}
        for e in events[:-1]:
            (c,) = e["choices"]
            got = choices.setdefault(c["index"], {"content": "", "finish": [], "logprobs": []})
            got["content"] += c["delta"].get("content") or ""
            if c["finish_reason"] is not None:
                got["finish"].append(c["finish_reason"])
            if c.get("logprobs"):
                got["logprobs"] += c["logprobs"]["content"]
        return choices, events[-1]["usage"]

    fast, fast_usage = joined_chat(_sse_events(results["chat", 0.0]))
    slow, slow_usage = joined_chat(_sse_events(results["chat", 0.03]))
    assert len(results["chat", 0.03]) < len(results["chat", 0.0])
    assert _same(fast, slow) and fast_usage == slow_usage
    whole = results["chat"]
    for c in whole.choices:
        got = fast[c.index]
        assert got["content"] == c.message.content and got["finish"] == [c.finish_reason]
        assert _same(got["logprobs"], c.logprobs.model_dump()["content"])
    assert fast_usage["completion_tokens"] == whole.usage.completion_tokens


def test_a_beam_search_admitted_before_a_drain_finishes(tiny_llama: Path) -> None:
    # Each beam step is a new engine request: a draining server (stop_accepting) refuses new
    # requests but lets a search it had admitted run to its end.

    from forkless.engine.async_llm import EngineShuttingDownError, gather_streams
    from forkless.sampling_params import BeamSearchParams

    async def main() -> tuple[int, bool]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            await llm.start()
            params = BeamSearchParams(beam_width=2, max_tokens=120, ignore_eos=True)
            search = llm.beam_search("Hello there", "beam", params)

            async def run() -> int:
                async for out in search:
                    final = out
                return len(final.outputs[0].token_ids)

            task = asyncio.create_task(run())
            await asyncio.sleep(0.2)  # a few steps in
            llm.stop_accepting()
            refused = False
            try:
                llm.generate("new", SamplingParams(max_tokens=2), "late")
            except EngineShuttingDownError:
                refused = True
            return await task, refused
        finally:
            llm.shutdown()

    tokens, refused = asyncio.run(main())
    assert tokens == 120 and refused


def test_a_value_of_the_wrong_type_is_refused_and_never_reaches_the_engine_core(tiny_llama: Path) -> None:
    """A request the engine core's typed decoding would refuse is the caller's
    InvalidRequestError (the server's 400), decoded as the core decodes it before it is
    sent; and a malformed message that reaches the core all the same fails alone: the
    engine keeps serving (it once died of a string where a flag is a boolean)."""
    import msgspec
    import pytest

    from forkless.engine.async_llm import InvalidRequestError
    from forkless.protocol import ipc
    from forkless.protocol.engine import EngineCoreRequest
    from forkless.sampling_params import StructuredOutputsParams

    async def main() -> None:
        args = EngineArgs(model=str(tiny_llama), max_model_len=256, kv_cache_memory=32 << 20)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        try:
            await llm.start()
            params = SamplingParams(max_tokens=3, structured_outputs=StructuredOutputsParams(regex="[ab]+"))
            params.structured_outputs.disable_any_whitespace = "maybe"  # past the constructor's checks
            with pytest.raises(InvalidRequestError, match="disable_any_whitespace"):
                async for _ in llm.generate("Hi", params, "typed"):
                    pass
            good = EngineCoreRequest(request_id="raw", prompt_token_ids=[1, 2, 3],
                                     sampling_params=SamplingParams(max_tokens=2), eos_token_id=None,
                                     arrival_time=time.time())
            raw = msgspec.to_builtins(good)
            raw["sampling_params"]["temperature"] = "hot"
            await llm.client.add_request(ipc.encode(raw))
            async for out in llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=4), "after"):
                final = out
            assert final.finished and len(final.outputs[0].token_ids) == 4 and not llm.errored
        finally:
            llm.shutdown()

    asyncio.run(main())


def test_the_engine_cores_calls_run_between_steps_as_vllms_engine_client(tiny_llama: Path) -> None:
    import pytest

    async def main() -> None:
        args = EngineArgs(model=str(tiny_llama), max_model_len=512, kv_cache_memory=32 << 20,
                          distributed_executor_backend="mp", enable_sleep_mode=True,
                          worker_extension_cls="tests.engine.worker_extensions.ModelInfoExtension")
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        greedy = SamplingParams(temperature=0, max_tokens=6)

        async def text(rid: str) -> str:
            async for out in llm.generate("Paris is", greedy, rid):
                final = out
            return final.outputs[0].text

        try:
            before = await text("a")
            # A worker extension's method, by name, on every worker (RLHF frameworks' route).
            assert await llm.collective_rpc("rank_and", args=([3],)) == [{"rank": 0, "value": [3]}]
            assert (await llm.collective_rpc("num_parameters"))[0] > 0
            with pytest.raises(RuntimeError, match="has no public method 'no_such_method'"):
                await llm.collective_rpc("no_such_method")  # (the worker's error; the engine goes on)
            with pytest.raises(TypeError, match="name of a worker method"):
                await llm.collective_rpc(lambda worker: 1)  # type: ignore[arg-type]
            await llm.check_health()
            assert await llm.reset_prefix_cache() is True
            # mode="wait" (vLLM's): the request in flight finishes first; one sent meanwhile
            # waits for the wake-up.
            async def long() -> tuple[int, str | None]:
                async for out in llm.generate("Paris is", SamplingParams(max_tokens=500, ignore_eos=True), "long"):
                    final = out
                return len(final.outputs[0].token_ids), final.outputs[0].finish_reason

            running = asyncio.ensure_future(long())
            await asyncio.sleep(0.05)
            sleeping = asyncio.ensure_future(llm.sleep(2, mode="wait"))
            while not await llm.is_paused():  # (sleep pauses first)
                await asyncio.sleep(0.005)
            queued = asyncio.ensure_future(text("queued"))
            assert await running == (500, "length") and (await sleeping) is None
            await asyncio.sleep(0.3)
            assert not queued.done()  # it waits while the engine sleeps
            assert await llm.is_sleeping()
            with pytest.raises(RuntimeError, match="sleeps already"):
                await llm.sleep(1)
            with pytest.raises(ValueError, match="'keep' with sleep level 1 is not supported"):
                await llm.sleep(1, mode="keep")
            assert await llm.wake_up(["weights"]) is False  # (the KV cache still sleeps)
            assert not queued.done()
            assert await llm.wake_up() is True
            assert await asyncio.wait_for(queued, 60) == before  # run once all is awake
            assert not await llm.is_sleeping()
            assert await text("b") == before  # the same weights and a working cache
            with pytest.raises(ValueError, match="tags"):
                await llm.wake_up(["bogus"])
        finally:
            llm.shutdown()

    asyncio.run(main())


def test_pause_generation_aborts_waits_or_keeps_and_resume_runs_what_came_meanwhile(tiny_llama: Path) -> None:
    import pytest

    async def main() -> None:
        # Async scheduling: a paused engine must still collect the step it launched.
        args = EngineArgs(model=str(tiny_llama), max_model_len=512, kv_cache_memory=32 << 20,
                          distributed_executor_backend="mp", async_scheduling=True)
        llm = AsyncLLM.from_engine_args(args, log_stats=False)
        greedy = SamplingParams(temperature=0, max_tokens=6)
        long_params = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
        seen: dict[str, int] = {}

        async def run(rid: str, params: SamplingParams = greedy) -> tuple[list[int], str | None]:
            async for out in llm.generate("Paris is", params, rid):
                seen[rid] = len(out.outputs[0].token_ids)
                final = out
            return list(final.outputs[0].token_ids), final.outputs[0].finish_reason

        async def started(rid: str, params: SamplingParams) -> asyncio.Future:
            task = asyncio.ensure_future(run(rid, params))
            await until(lambda: seen.get(rid, 0) > 2)
            return task

        try:
            short = await run("ref-short")
            reference = await run("ref-long", long_params)
            assert not await llm.is_paused()
            # abort (vLLM's default): what runs ends "abort"; what comes later waits, then runs.
            running = await started("a", long_params)
            await llm.pause_generation()
            assert (await running)[1] == "abort"
            assert await llm.is_paused() and await llm.is_sleeping()  # (vLLM's: a pause is level 0)
            queued = asyncio.ensure_future(run("queued"))
            await asyncio.sleep(0.3)
            assert not queued.done()
            await llm.resume_generation()
            assert await asyncio.wait_for(queued, 60) == short
            assert not await llm.is_paused()
            # wait: what runs finishes (it is not cut short).
            running = await started("w", long_params)
            await llm.pause_generation(mode="wait")
            assert await asyncio.wait_for(running, 30) == reference
            await llm.resume_generation()
            # keep: what runs is frozen, its KV cache kept, and goes on after the resume
            # with the tokens it would have had.
            running = await started("k", long_params)
            await llm.pause_generation(mode="keep", clear_cache=False)
            await asyncio.sleep(0.3)  # (the outputs of the step collected by the pause are read)
            frozen = seen["k"]
            await asyncio.sleep(0.3)
            assert seen["k"] == frozen < 300 and not running.done()
            await llm.resume_generation()
            assert await asyncio.wait_for(running, 60) == reference
            await llm.resume_generation()  # (not paused: nothing to do)
            # Bad values are refused by name; sleep's level 0 is a pause (no sleep mode needed).
            with pytest.raises(ValueError, match="mode='freeze' is invalid"):
                await llm.pause_generation(mode="freeze")
            with pytest.raises(ValueError, match="clear_cache='yes' is invalid"):
                await llm.pause_generation(clear_cache="yes")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="sleep mode is off"):
                await llm.sleep(1)
            with pytest.raises(ValueError, match="'keep' with sleep level 1"):
                await llm.sleep(1, mode="keep")
            await llm.sleep(0, mode="keep")
            assert await llm.is_paused()
            queued = asyncio.ensure_future(run("after-wake"))
            assert await llm.wake_up(["scheduling"]) is True
            assert await asyncio.wait_for(queued, 60) == short
            with pytest.raises(RuntimeError, match="not sleeping"):
                await llm.wake_up()
        finally:
            llm.shutdown()

    asyncio.run(main())
