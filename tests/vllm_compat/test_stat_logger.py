"""Stat loggers with vLLM's signatures, and the plugin group read the way vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import plugin_env, run_forkless, run_python
from tests.server.conftest import until

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
            prompt = "a prompt long enough to fill whole blocks of the prefix cache " * 3
            for rid in ("r2", "r3"):  # the second finds the first's blocks
                async for out in engine.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True), rid):
                    pass
            (logger,) = [s for s in engine.stat_loggers if isinstance(s, CountingStatLogger)]
            await until(lambda: sum(n for _, n in logger.records) >= 10)  # recorded after the tokens go out
        finally:
            engine.shutdown()
        return logger, out.num_cached_tokens, len(out.prompt_token_ids)

    logger, cached, prompt_len = asyncio.run(main())
    assert logger.initialized and logger.vllm_config is not None and logger.engine_idx == 0
    assert sum(n for _, n in logger.records) == 10
    assert {idx for idx, _ in logger.records} == {0}
    # vLLM's field names: one request ran at a time, nothing waited, first tokens came once each.
    assert max(logger.running) == 1 and set(logger.waiting) == {0}
    assert len(logger.ttfts) == 3 and all(t > 0 for t in logger.ttfts)
    # Per-interval prefix-cache counters add up to the lookups: the second long prompt hit.
    assert cached > 0 and logger.prefix_hits == cached
    assert logger.prefix_queries >= 2 * prompt_len - 2 and logger.steps == sorted(set(logger.steps))
    assert [f[:2] for f in logger.finished] == [(0, 4), (0, 3), (cached, 3)]
    assert all(tpot > 0 for *_, tpot in logger.finished)
    # vLLM's FinishReason compares and prints as vLLM's; the config answers vLLM's names.
    assert logger.reasons == ["length"] * 3
    assert logger.num_gpu_blocks == (32 << 20) // _block_bytes(tiny_llama)
    config = json.loads((tiny_llama / "config.json").read_text())
    assert logger.model == (config["architectures"][0], config["vocab_size"], config["hidden_size"],
                            config["num_hidden_layers"])


def _block_bytes(model: Path) -> int:
    """A KV block's bytes for the tiny model (16 tokens, float32 keys and values, every layer)."""
    c = json.loads((model / "config.json").read_text())
    heads = c.get("num_key_value_heads", c["num_attention_heads"])
    return 16 * 2 * c["num_hidden_layers"] * heads * (c["hidden_size"] // c["num_attention_heads"]) * 4


def test_a_logger_whose_constructor_fails_is_named() -> None:
    import pytest

    from forkless.metrics import StatLoggerBase
    from forkless.metrics.registry import make_stat_logger

    class Broken(StatLoggerBase):
        def __init__(self, vllm_config, engine_idx=0):
            raise KeyError("no_such_setting")

        def record(self, *args, **kwargs):
            pass

        def log_engine_initialized(self):
            pass

    with pytest.raises(RuntimeError, match=r"stat logger plugin 'broken'.*Broken\(config, 0\) raised KeyError"):
        make_stat_logger(Broken, object(), "stat logger plugin 'broken'")


def test_disable_log_stats_is_an_engine_argument(tiny_llama: Path) -> None:
    from forkless import AsyncLLM
    from forkless.config import EngineArgs
    from forkless.metrics import LoggingStatLogger

    def kinds(**kwargs: object) -> set[type]:
        args = EngineArgs(model=str(tiny_llama), max_model_len=128, **kwargs)  # type: ignore[arg-type]
        return {type(s) for s in AsyncLLM.from_engine_args(args).stat_loggers}

    assert LoggingStatLogger in kinds()
    assert LoggingStatLogger not in kinds(disable_log_stats=True)


_LOGGERS = '''
from forkless.metrics import StatLoggerBase

class Good(StatLoggerBase):
    def record(self, *args, **kwargs): pass
    def log_engine_initialized(self): pass

class NoRecord(StatLoggerBase):
    def log_engine_initialized(self): pass

class BadInit(Good):
    def __init__(self):
        pass

class NotALogger:
    pass
'''


def test_a_plugin_that_cannot_be_a_logger_is_skipped_by_name(tmp_path: Path) -> None:
    """As any failing plugin: left out with a warning naming it and what was expected (the
    server used to stop with a traceback), and an error under FORKLESS_PLUGINS_STRICT=1."""
    from tests.plugins.test_cli import fake_plugin

    site = tmp_path / "site"
    for name, cls in (("a_good", "Good"), ("b_no_record", "NoRecord"), ("c_bad_init", "BadInit"),
                      ("d_not_a_logger", "NotALogger")):
        fake_plugin(site, name, f"from probe_loggers import {cls} as LOGGER\n", "forkless.stat_logger_plugins",
                    "LOGGER", probe_loggers=_LOGGERS)
    code = ("from forkless.metrics import load_stat_logger_plugin_factories\n"
            "print([c.__name__ for c in load_stat_logger_plugin_factories()])\n")
    proc = run_python(code, plugin_env(site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "['Good']"
    assert "stat logger plugin 'b_no_record': probe_loggers.NoRecord does not implement record" in proc.stderr
    assert "stat logger plugin 'c_bad_init': probe_loggers.BadInit cannot be built as BadInit(vllm_config, " \
           "engine_index)" in proc.stderr
    assert "stat logger plugin 'd_not_a_logger'" in proc.stderr and "not a forkless.metrics.StatLoggerBase" \
        in proc.stderr
    strict = run_python(code, plugin_env(site, tmp_path, FORKLESS_PLUGINS_STRICT="1"))
    assert strict.returncode != 0 and "stat logger plugin 'b_no_record'" in strict.stderr
    assert "PluginLoadError" in strict.stderr
    # plugins list shows them as the server takes them (it said "loaded").
    listed = run_forkless(["plugins", "list", "--json"], plugin_env(site, tmp_path))
    status = {r["name"]: r["status"] for r in json.loads(listed.stdout) if r["group"] == "forkless.stat_logger_plugins"}
    assert status == {"a_good": "loaded", "b_no_record": "failed", "c_bad_init": "failed",
                      "d_not_a_logger": "failed"}, listed.stderr
