"""Stat loggers with vLLM's signatures, and the plugin group read the way vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import plugin_env, run_python

_FACTORIES = (
    "import json, os\n"
    "from forkless.metrics import load_stat_logger_plugin_factories\n"
    "first = [c.__name__ for c in load_stat_logger_plugin_factories()]\n"
    "os.environ['FORKLESS_PLUGINS'] = 'example_model'\n"
    "second = [c.__name__ for c in load_stat_logger_plugin_factories()]\n"
    "print(json.dumps([first, second]))\n"
)


def test_factories_follow_the_allow_list_in_force_at_each_call(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(_FACTORIES, plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "JsonLinesStatLogger" in first
    assert second == []  # not cached from the first call


def test_a_vllm_style_logger_is_driven_with_vllm_signatures(tiny_llama: Path) -> None:
    import asyncio

    from forkless import AsyncLLM, SamplingParams
    from forkless.config import EngineArgs
    from tests.vllm_compat.vllm_style_stat_logger import CountingStatLogger

    async def main() -> CountingStatLogger:
        args = EngineArgs(model=str(tiny_llama), max_model_len=128, kv_cache_memory=32 << 20)
        engine = AsyncLLM.from_engine_args(args, stat_loggers=[CountingStatLogger], log_stats=False)
        try:
            await engine.start()
            async for _ in engine.generate("hello", SamplingParams(max_tokens=4, ignore_eos=True), "r1"):
                pass
            await asyncio.sleep(0.5)  # the output handler records after it hands out tokens
        finally:
            engine.shutdown()
        (logger,) = [s for s in engine.stat_loggers if isinstance(s, CountingStatLogger)]
        return logger

    logger = asyncio.run(main())
    assert logger.initialized and logger.vllm_config is not None
    assert sum(n for _, n in logger.records) == 4
    assert {idx for idx, _ in logger.records} == {0}


def test_disable_log_stats_is_an_engine_argument(tiny_llama: Path) -> None:
    from forkless import AsyncLLM
    from forkless.config import EngineArgs
    from forkless.metrics import LoggingStatLogger

    def kinds(**kwargs: object) -> set[type]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=128, **kwargs)  # type: ignore[arg-type]
        return {type(s) for s in AsyncLLM.from_engine_args(args).stat_loggers}

    assert LoggingStatLogger in kinds()
    assert LoggingStatLogger not in kinds(disable_log_stats=True)
