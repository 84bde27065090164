"""Engine arguments, configuration and the messages that cross process boundaries."""

from __future__ import annotations

import argparse
import json
import time

import msgspec
import pytest

from forkless.config import EngineArgs, EngineConfig
from forkless.core.request import FinishReason
from forkless.core.sched import EngineCoreOutput, SchedulerStats
from forkless.protocol.engine import EngineCoreOutputs, EngineCoreRequest
from forkless.executor import Executor, get_executor_cls
from forkless.sampling_params import SamplingParams

# Real classes: create_engine_config imports every --logits-processors path.
MIN_P = "forkless.logits_processors.min_p:MinPLogitsProcessor"
MIN_TOKENS = "forkless.logits_processors.min_tokens:MinTokensLogitsProcessor"


def test_cli_flags_use_vllm_names_and_build_a_config(llama_dir) -> None:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args([
        str(llama_dir), "--max-model-len", "128", "--block-size", "8", "--no-enable-prefix-caching",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--scheduling-policy", "priority",
        "--logits-processors", f"{MIN_P}, {MIN_TOKENS}", "--kv-cache-memory", "1000000", "--dtype", "float32",
    ])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.model_config.model == str(llama_dir)
    assert config.model_config.architecture == "LlamaForCausalLM"
    assert config.model_config.max_model_len == 128
    assert config.model_config.eos_token_id == 1
    assert config.cache_config.block_size == 8 and not config.cache_config.enable_prefix_caching
    assert config.scheduler_config.policy == "priority"
    assert config.scheduler_config.max_num_batched_tokens == 64
    assert config.logits_processors == [MIN_P, MIN_TOKENS]


def test_cpu_step_token_budget_defaults_to_2048(llama_dir) -> None:
    config = EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 20).create_engine_config()
    assert config.scheduler_config.max_num_batched_tokens == 2048
    # Without chunked prefill a step must still hold a whole prompt.
    whole = EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 20,
                       enable_chunked_prefill=False).create_engine_config()
    assert whole.scheduler_config.max_num_batched_tokens == max(2048, whole.model_config.max_model_len)


def test_engine_config_round_trips_through_msgpack(llama_dir) -> None:
    config = EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 20).create_engine_config()
    data = msgspec.msgpack.encode(config.to_builtins())
    back = EngineConfig.from_builtins(msgspec.msgpack.decode(data))
    assert back == config


def test_protocol_messages_round_trip_through_msgpack() -> None:
    request = EngineCoreRequest(
        request_id="r1", prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(temperature=0.5, stop=["x"], logit_bias={3: 1.0}),
        eos_token_id=2, arrival_time=time.time(), priority=1,
    )
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=EngineCoreRequest)
    assert back == request
    outputs = EngineCoreOutputs(
        outputs=[EngineCoreOutput("r1", [4], FinishReason.STOP, 2, [[4, 5], [-0.1, -2.0], 1], 4)],
        scheduler_stats=SchedulerStats(num_running=1, prefix_cache_hits=3),
        timestamp=1.5,
    )
    back_out = msgspec.msgpack.decode(msgspec.msgpack.encode(outputs), type=EngineCoreOutputs)
    assert back_out == outputs
    assert back_out.outputs[0].finish_reason is FinishReason.STOP


@pytest.mark.parametrize("kwargs, flag", [
    ({"dtype": "int8"}, "--dtype"),
    ({"block_size": 0}, "--block-size"),
    ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
    ({"scheduling_policy": "lifo"}, "--scheduling-policy"),
    ({"max_model_len": 100000}, "--max-model-len"),
])
def test_invalid_engine_args_name_the_flag(llama_dir, kwargs, flag) -> None:
    with pytest.raises(ValueError, match=flag):
        EngineArgs(model=str(llama_dir), **kwargs).create_engine_config()


def test_vllms_none_and_torch_dtype_engine_args_mean_what_they_mean_in_vllm(llama_dir) -> None:
    import torch

    # A vLLM script passing its argparse defaults: seed=None was refused, block_size=None
    # crashed in a division, and enable_prefix_caching=None turned prefix caching off.
    config = EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 20, seed=None, block_size=None,
                        max_num_seqs=None, enable_prefix_caching=None, enable_chunked_prefill=None,
                        dtype=torch.float32).create_engine_config()
    assert config.device_config.seed == 0 and config.cache_config.block_size == 16
    assert config.scheduler_config.max_num_seqs == 256
    assert config.cache_config.enable_prefix_caching and config.scheduler_config.enable_chunked_prefill
    assert config.model_config.dtype == "float32"  # was "--dtype=torch.float32 is invalid"
    with pytest.raises(ValueError, match="--dtype='float64'"):
        EngineArgs(model=str(llama_dir), dtype=torch.float64).create_engine_config()


def test_unsupported_architecture_lists_the_supported_ones(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))
    with pytest.raises(ValueError, match="FooForCausalLM") as info:
        EngineArgs(model=str(tmp_path)).create_engine_config()
    assert "LlamaForCausalLM" in str(info.value) and "Qwen3ForCausalLM" in str(info.value)


def test_executor_backend_resolution() -> None:
    from forkless.executor.uniproc import UniProcExecutor

    assert get_executor_cls("uni") is UniProcExecutor
    assert get_executor_cls("forkless.executor.uniproc:UniProcExecutor") is UniProcExecutor
    with pytest.raises(ValueError, match="--distributed-executor-backend"):
        get_executor_cls("nonsense")
    with pytest.raises(TypeError, match="Executor"):
        get_executor_cls("forkless.config:EngineArgs")
    assert issubclass(UniProcExecutor, Executor)


# ----------------------------------------------------- class paths, checked up front


@pytest.mark.parametrize("kwargs, error, fragments", [
    ({"logits_processors": "nosuch.mod:X"}, ImportError,
     ["--logits-processors", "'nosuch.mod:X'", "No module named 'nosuch'", "LogitsProcessor"]),
    ({"logits_processors": [MIN_P, "forkless.config:EngineArgs"]},
     TypeError, ["--logits-processors", "forkless.config.EngineArgs", "LogitsProcessor"]),
    ({"logits_processors": "not-a-path"}, ValueError, ["--logits-processors", "'not-a-path'", "class path"]),
    ({"scheduler_cls": "collections:OrderedDict"}, TypeError,
     ["--scheduler-cls", "collections.OrderedDict", "SchedulerInterface"]),
    ({"scheduler_cls": "nosuch.sched:S"}, ImportError, ["--scheduler-cls", "'nosuch.sched:S'", "SchedulerInterface"]),
])
def test_class_paths_are_checked_before_the_model_is_resolved(kwargs, error, fragments) -> None:
    # The model does not exist: only a check that runs first can report the class path.
    with pytest.raises(error) as info:
        EngineArgs(model="/no/such/model", **kwargs).create_engine_config()
    assert all(f in str(info.value) for f in fragments), str(info.value)


@pytest.fixture
def no_executor_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Executors fail loudly when built: a test passes only if the error came first."""
    from forkless.executor.multiproc import MultiprocExecutor
    from forkless.executor.uniproc import UniProcExecutor

    def refuse(self, config) -> None:  # type: ignore[no-untyped-def]
        raise AssertionError("an executor started (and loaded the model) before the error")

    monkeypatch.setattr(UniProcExecutor, "__init__", refuse)
    monkeypatch.setattr(MultiprocExecutor, "__init__", refuse)


@pytest.mark.parametrize("kwargs, error, flag", [
    ({"logits_processors": "nosuch.mod:X"}, ImportError, "--logits-processors"),
    ({"scheduler_cls": "collections:OrderedDict"}, TypeError, "--scheduler-cls"),
    ({"scheduler_cls": "collections:OrderedDict", "distributed_executor_backend": "mp"}, TypeError,
     "--scheduler-cls"),
    ({"distributed_executor_backend": "nonsense"}, ValueError, "--distributed-executor-backend"),
    ({"distributed_executor_backend": "forkless.config:EngineArgs"}, TypeError, "--distributed-executor-backend"),
])
def test_llm_reports_a_bad_class_path_before_starting_anything(llama_dir, no_executor_may_start, kwargs,
                                                                error, flag) -> None:
    from forkless import LLM

    with pytest.raises(error, match=flag):
        LLM(model=str(llama_dir), kv_cache_memory=1 << 20, **kwargs)


def test_async_llm_rejects_a_bad_executor_before_spawning_the_engine_core(llama_dir) -> None:
    from forkless.engine.async_llm import AsyncLLM

    config = EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 20,
                        distributed_executor_backend="nonsense").create_engine_config()
    with pytest.raises(ValueError, match="--distributed-executor-backend='nonsense'"):
        AsyncLLM(config)


def test_reasoning_config_takes_vllms_keys_and_the_reasoning_parser(llama_dir) -> None:
    from forkless.config import ReasoningConfig

    def build(**kwargs) -> EngineConfig:
        return EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 20, **kwargs).create_engine_config()

    assert build().reasoning_config is None
    assert build(reasoning_parser="qwen3").reasoning_config == ReasoningConfig(reasoning_parser="qwen3")
    given = '{"reasoning_start_str": "<think>", "reasoning_end_str": "Now answer.</think>"}'
    config = build(reasoning_config=given, reasoning_parser="deepseek_r1")
    assert config.reasoning_config == ReasoningConfig("deepseek_r1", "<think>", "Now answer.</think>")
    assert EngineConfig.from_builtins(msgspec.msgpack.decode(msgspec.msgpack.encode(config.to_builtins()))) == config
    for kwargs, words in (({"reasoning_config": '{"think_start_str": "<think>"}'}, "unknown key"),
                          ({"reasoning_config": '{"reasoning_end_str": 5}'}, "expected a string"),
                          ({"reasoning_config": "[1]"}, "JSON object"),
                          ({"reasoning_config": '{"reasoning_parser": "nope"}'}, "nope"),
                          ({"reasoning_config": '{"reasoning_parser": "qwen3"}', "reasoning_parser": "deepseek_r1"},
                           "disagree")):
        with pytest.raises(ValueError, match=words) as info:
            build(**kwargs)
        assert "--reasoning" in str(info.value)


def test_reasoning_markers_become_token_ids_as_vllm_tokenizes_them() -> None:
    from forkless.config import ReasoningConfig

    class Chars:  # one token per character
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            assert not add_special_tokens
            return [ord(c) for c in text]

    think, end = [ord(c) for c in "<think>"], [ord(c) for c in "</think>"]
    assert ReasoningConfig(reasoning_parser="qwen3").token_ids(Chars()) == (think, end)
    # The config's own strings win over the parser's, one by one.
    assert ReasoningConfig("qwen3", reasoning_end_str="!</think>").token_ids(Chars()) == (think, [33] + end)
    assert ReasoningConfig(reasoning_start_str="<think>").token_ids(Chars()) is None  # no end, no parser
    with pytest.raises(ValueError, match="failed to tokenize"):
        ReasoningConfig("", "<think>", "</think>").token_ids(type("Empty", (), {"encode": lambda *a, **k: []})())
