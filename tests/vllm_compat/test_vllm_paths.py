"""vLLM's import paths, renamed, give forkless's own modules; the helpers and names that
ported plugins use exist and behave as vLLM's."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from forkless.module_aliases import ALIASES
from tests.conftest import plugin_env, run_forkless, run_python


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_is_the_module_it_names(alias: str) -> None:
    module = importlib.import_module(alias)
    target = importlib.import_module(ALIASES[alias])
    assert module is target and sys.modules[alias] is target
    assert target.__spec__.name == target.__name__ == ALIASES[alias]  # its own spec kept


def test_a_submodule_of_an_alias_is_the_submodule_itself() -> None:
    # The import system used to load these from the target's folder a second time, with
    # a second LogitsProcessor class that forkless's checks did not accept.
    code = ("import sys\n"
            "from forkless.v1.sample.logits_processor.interface import LogitsProcessor as A\n"
            "from forkless.v1.sample.logits_processor.state import process_dict_updates as f\n"
            "import forkless.logits_processors as lp\n"
            "import forkless.entrypoints.openai.tool_parsers.hermes as h\n"
            "import forkless.tool_parsers.hermes as h2\n"
            "assert A is lp.LogitsProcessor and f is lp.process_dict_updates and h is h2\n"
            "assert lp.interface is sys.modules['forkless.logits_processors.interface']\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_the_names_ported_plugins_import() -> None:
    from forkless.logits_process import LogitsProcessor as RequestLogitsProcessor
    from forkless.lora.request import LoRARequest
    from forkless.lora.resolver import LoRAResolver, LoRAResolverRegistry
    from forkless.model_executor.custom_op import CustomOp
    from forkless.model_executor.models import ModelRegistry
    from forkless.model_executor.models.llama import LlamaForCausalLM
    from forkless.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam
    from forkless.entrypoints.openai.engine.protocol import ResponsesRequest
    from forkless.plugins.io_processors.interface import IOProcessor
    from forkless.model_executor.layers.activation import SiluAndMul
    from forkless.model_executor.layers.layernorm import RMSNorm
    from forkless.model_executor.layers.rotary_embedding import RotaryEmbedding
    from forkless.entrypoints.pooling.pooling.protocol import IOProcessorResponse
    from forkless.v1.core.sched.output import SchedulerOutput
    from forkless.v1.request import Request
    from forkless.v1.sample.logits_processor import LOGITSPROCS_GROUP, AdapterLogitsProcessor
    from forkless.v1.sample.logits_processor.builtin import MinPLogitsProcessor, process_dict_updates

    import torch

    import forkless
    import forkless.lora
    from forkless.io_processors import IOProcessor as OwnIOProcessor
    from forkless.logits_processors import AdapterLogitsProcessor as Own, RequestLogitsProcessor as OwnRLP
    from forkless.protocol.lora import LoRARequest as OwnRequest

    assert AdapterLogitsProcessor is Own and RequestLogitsProcessor is OwnRLP and LoRARequest is OwnRequest
    assert ModelRegistry is forkless.ModelRegistry and "LlamaForCausalLM" in ModelRegistry.get_supported_archs()
    assert IOProcessor is OwnIOProcessor and LOGITSPROCS_GROUP == "forkless.logits_processors"
    assert issubclass(MinPLogitsProcessor, forkless.logits_processors.LogitsProcessor)
    assert callable(process_dict_updates) and isinstance(LoRAResolverRegistry.resolvers, dict)
    assert issubclass(LlamaForCausalLM, torch.nn.Module) and issubclass(CustomOp, torch.nn.Module)
    assert LoRAResolver is forkless.lora.LoRAResolver
    assert ChatCompletionNamedToolChoiceParam.model_validate(
        {"type": "function", "function": {"name": "f"}}).function.name == "f"
    assert ResponsesRequest is not None
    import forkless.ops as ops
    from forkless.core.request import Request as OwnRequestState
    from forkless.protocol.pooling import IOProcessorResponse as OwnResponse
    from forkless.protocol.step import SchedulerOutput as OwnOutput

    assert (RMSNorm, SiluAndMul, RotaryEmbedding) == (ops.layernorm.RMSNorm, ops.activation.SiluAndMul,
                                                      ops.rotary.RotaryEmbedding)
    assert issubclass(RMSNorm, CustomOp) and callable(RMSNorm.register_oot)
    assert (IOProcessorResponse, SchedulerOutput, Request) == (OwnResponse, OwnOutput, OwnRequestState)


def test_vllms_small_helpers(tmp_path: Path) -> None:
    import torch
    from forkless.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from forkless.transformers_utils.tokenizer import AnyTokenizer
    from forkless.utils import random_uuid
    from forkless.utils.collection_utils import is_list_of
    from forkless.utils.import_utils import import_from_path
    from forkless.utils.torch_utils import async_tensor_h2d
    from forkless.v1.engine.async_llm import AsyncLLM

    import forkless

    assert (EngineArgs, AsyncEngineArgs, AsyncLLM) == (forkless.EngineArgs, forkless.AsyncEngineArgs, forkless.AsyncLLM)
    assert AnyTokenizer is forkless.tokenizers.TokenizerLike
    a, b = random_uuid(), random_uuid()
    assert a != b and len(a) == 32 and int(a, 16) >= 0
    assert is_list_of([1, "x"], int) and not is_list_of([1, "x"], int, check="all") and not is_list_of((1,), int)
    file = tmp_path / "my_parsers.py"
    file.write_text("VALUE = 42\n")
    assert import_from_path("my_parsers_mod", file).VALUE == 42
    moved = async_tensor_h2d([[3, 1], [4, 1]], torch.int32, "cpu", pin_memory=False)
    assert moved.dtype == torch.int32 and moved.tolist() == [[3, 1], [4, 1]]


def test_envs_read_under_vllms_names_are_forkless_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless import envs

    monkeypatch.setenv("FORKLESS_LORA_RESOLVER_CACHE_DIR", "/tmp/adapters")
    assert envs.VLLM_LORA_RESOLVER_CACHE_DIR == envs.FORKLESS_LORA_RESOLVER_CACHE_DIR == "/tmp/adapters"
    assert envs.VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS == 1
    with pytest.raises(AttributeError, match="FORKLESS_NO_SUCH_THING is not one of them"):
        envs.VLLM_NO_SUCH_THING  # noqa: B018


def test_registering_a_class_that_is_no_parser_is_refused_at_once() -> None:
    from forkless.reasoning import ReasoningParserManager
    from forkless.tool_parsers import ToolParserManager

    class NotAParser:
        def extract_tool_calls(self, model_output, request): ...

    with pytest.raises(TypeError, match=r"'not_a_parser': tests.vllm_compat.test_vllm_paths.test_registering_a_class"
                                        r"_that_is_no_parser_is_refused_at_once.<locals>.NotAParser is not a subclass "
                                        r"of forkless.tool_parsers"):
        ToolParserManager.register_module("not_a_parser", module=NotAParser)
    with pytest.raises(TypeError, match="is not a subclass of"):
        ReasoningParserManager.register_module("not_a_parser", module=NotAParser)
    assert "not_a_parser" not in ToolParserManager.list_registered()


def test_tool_parser_helpers() -> None:
    from partial_json_parser.core.options import Allow

    from forkless.tool_parsers.utils import (
        consume_space,
        extract_intermediate_diff,
        find_all_indices,
        find_common_prefix,
        find_common_suffix,
        is_complete_json,
        partial_json_loads,
        partial_tag_overlap,
    )

    assert find_common_prefix('{"fruit": "ap"}', '{"fruit": "apple"}') == '{"fruit": "ap'
    assert find_common_suffix('{"fruit": "ap"}', '{"fruit": "apple"}') == '"}'
    assert extract_intermediate_diff('{"fruit": "apple"}', '{"fruit": "ap"}') == "ple"
    assert partial_tag_overlap("reply <tool_", "<tool_call>") == 6 and partial_tag_overlap("x", "<a>") == 0
    assert find_all_indices("aaa", "aa") == [0, 1]
    assert is_complete_json('{"a": 1}') and not is_complete_json('{"a": 1')
    assert consume_space(1, "a \n b") == 4
    # Unfinished JSON, and a whole value followed by more text (vLLM's two cases).
    assert partial_json_loads('{"city": "Par', Allow.ALL) == ({"city": "Par"}, 13)
    assert partial_json_loads('{"a": 1} trailing', Allow.ALL) == ({"a": 1}, 8)


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_the_forced_tool_choice_schema_gathers_the_tools_defs() -> None:
    from forkless.tool_parsers.utils import get_json_schema_from_tools

    city = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    tools = [_tool("weather", {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
                               "required": ["city"], "$defs": {"City": city}}),
             _tool("time", {"type": "object", "properties": {"zone": {"type": "string"}}})]
    schema = get_json_schema_from_tools("required", tools)
    assert schema["$defs"] == {"City": city} and "$defs" in tools[0]["function"]["parameters"]  # not mutated
    jsonschema.validate([{"name": "weather", "parameters": {"city": {"name": "Paris"}}},
                         {"name": "time", "parameters": {"zone": "CET"}}], schema)
    with pytest.raises(jsonschema.ValidationError):  # the $ref is followed
        jsonschema.validate([{"name": "weather", "parameters": {"city": {"nom": "Paris"}}}], schema)
    assert get_json_schema_from_tools({"type": "function", "function": {"name": "time"}}, tools) == \
        tools[1]["function"]["parameters"]
    assert get_json_schema_from_tools("auto", tools) is None and get_json_schema_from_tools("none", tools) is None
    clash = tools + [_tool("other", {"type": "object", "$defs": {"City": {"type": "string"}}})]
    with pytest.raises(ValueError, match="define \\$defs 'City' differently"):
        get_json_schema_from_tools("required", clash)
    with pytest.raises(ValueError, match="names function 'nope', which is not in tools"):
        get_json_schema_from_tools({"type": "function", "function": {"name": "nope"}}, tools)


def test_the_forced_tool_choice_schema_keeps_draft7_definitions_and_self_references() -> None:
    # pydantic v1 and zod write "definitions"; a recursive schema refers to itself by "#".
    from forkless.tool_parsers.utils import get_json_schema_from_tools

    loc = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tree = {"type": "object", "properties": {"label": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["label"]}
    tools = [_tool("where", {"type": "object", "properties": {"loc": {"$ref": "#/definitions/Loc"}},
                             "required": ["loc"], "definitions": {"Loc": loc}}),
             _tool("outline", tree)]
    schema = get_json_schema_from_tools("required", tools)
    assert schema["definitions"] == {"Loc": loc}
    jsonschema.validate([{"name": "where", "parameters": {"loc": {"city": "Paris"}}},
                         {"name": "outline", "parameters": {"label": "a", "children": [{"label": "b"}]}}], schema)
    for bad in ([{"name": "where", "parameters": {"loc": {"town": "Paris"}}}],
                [{"name": "outline", "parameters": {"label": "a", "children": [{"title": "b"}]}}]):
        with pytest.raises(jsonschema.ValidationError):  # both references are followed
            jsonschema.validate(bad, schema)


def test_an_entry_point_left_in_a_vllm_group_is_named_with_its_new_group(tmp_path: Path) -> None:
    site = tmp_path / "site"
    meta = site / "ported_plugin-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: ported-plugin\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text("[vllm.general_plugins]\nported = ported_plugin:register\n")
    proc = run_forkless(["plugins", "check", "ported"], plugin_env(site, tmp_path), timeout=120)
    assert proc.returncode == 2
    assert ("'ported' of ported-plugin in group vllm.general_plugins (rename it to forkless.general_plugins)"
            in proc.stderr), proc.stderr
    # Checking everything says so too (nothing of forkless's groups to check from this site).
    checked = run_forkless(["plugins", "check"], plugin_env(site, tmp_path), timeout=120)
    assert "rename it to forkless.general_plugins" in checked.stderr, checked.stderr
    listed = run_forkless(["plugins", "list", "--json"], plugin_env(site, tmp_path), timeout=120)
    assert listed.returncode == 0 and json.loads(listed.stdout) is not None
    assert "rename it to forkless.general_plugins" in listed.stderr
    # An engine says so too when it loads the general plugins, once (not again in each
    # process it spawns), with the plugin cache on and off.
    code = "from forkless.plugins import load_general_plugins\nload_general_plugins()\nload_general_plugins()\n"
    for cache in ("1", "0"):
        proc = run_python(code, plugin_env(site, tmp_path, FORKLESS_PLUGIN_CACHE=cache))
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("rename it to forkless.general_plugins") == 1, proc.stderr


def _import_error(path: str, name: str) -> tuple[str, str]:
    """``(exc.name, message)`` of ``from path import name`` in a fresh interpreter."""
    code = (f"try:\n    from {path} import {name}\nexcept ModuleNotFoundError as exc:\n"
            "    print(exc.name); print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") >= 2, proc.stderr
    return tuple(proc.stdout.strip().split("\n", 1))  # type: ignore[return-value]


def test_a_vllm_path_forkless_lacks_says_what_to_use_instead() -> None:
    """A Model Runner V2 logits processor does not port; its import says so and names the
    v1 interface, instead of only the missing module."""
    name, message = _import_error("forkless.v1.worker.gpu.sample.logits_processor", "LogitsProcessor")
    assert name == "forkless.v1.worker"
    assert "Model Runner V2" in message and "forkless.v1.sample.logits_processor.LogitsProcessor" in message


def test_a_vllm_module_beneath_an_alias_that_forkless_lacks_is_named_as_imported() -> None:
    """vLLM's model-building modules have no forkless counterpart: the error names the path
    the plugin wrote, not the forkless module the alias mapped it to."""
    name, message = _import_error("forkless.model_executor.layers.logits_processor", "LogitsProcessor")
    assert name == "forkless.model_executor.layers.logits_processor"
    assert "forkless.ops" not in message and "no counterpart of this vLLM module" in message


def test_vllm_0_32_names_plugins_import() -> None:
    from forkless.exceptions import VLLMValidationError
    from forkless.plugins import DEFAULT_PLUGINS_GROUP
    from forkless.reasoning.qwen3_engine_reasoning_parser import Qwen3ReasoningParser
    from forkless.renderers.chat_utils import make_tool_call_id
    from forkless.tool_parsers.abstract_tool_parser import Tool
    from forkless.utils.import_utils import resolve_obj_by_qualname
    from forkless.utils.mistral import is_mistral_tokenizer

    import forkless

    # A logits processor's validate_params raising vLLM's error is a ValueError, which
    # forkless answers with a 400 (and an offline caller catches as one).
    error = VLLMValidationError("top_k too large", parameter="top_k", value=99)
    assert isinstance(error, ValueError) and str(error) == "top_k too large (parameter=top_k, value=99)"
    assert DEFAULT_PLUGINS_GROUP == "forkless.general_plugins"
    assert Qwen3ReasoningParser is forkless.reasoning.qwen3.Qwen3ReasoningParser
    assert make_tool_call_id().startswith("chatcmpl-tool-") and make_tool_call_id("kimi_k2", "f", 2) == "functions.f:2"
    assert Tool is forkless.protocol.openai.ChatCompletionToolParam
    assert resolve_obj_by_qualname("forkless.exceptions.VLLMValidationError") is VLLMValidationError
    assert is_mistral_tokenizer(object()) is False


def test_the_config_answers_vllms_names(tiny_llama: Path) -> None:
    from forkless.config import EngineArgs

    config = EngineArgs(model=str(tiny_llama), max_model_len=128).create_engine_config()
    hf = json.loads((tiny_llama / "config.json").read_text())
    model = config.model_config
    assert model.architectures == hf["architectures"] and model.get_vocab_size() == hf["vocab_size"]
    assert model.get_hidden_size() == hf["hidden_size"] == model.hf_text_config.hidden_size
    assert model.hf_config.num_hidden_layers == hf["num_hidden_layers"]
    assert str(config.device_config.device) == "cpu" and config.parallel_config.data_parallel_size == 1
    assert config.cache_config.num_gpu_blocks is None  # set when the engine core has sized the cache
    config.cache_config.num_blocks = 7
    assert config.cache_config.num_gpu_blocks == 7
    assert type(config).from_builtins(config.to_builtins()) == config  # no new fields cross processes


def test_a_ported_stat_loggers_factory_type_imports() -> None:
    """vLLM's ``StatLoggerFactory`` (what ``AsyncLLM(stat_loggers=...)`` takes) is a type a
    ported logger's hints import; forkless's loggers are all per engine."""
    from typing import get_args

    from forkless.metrics import StatLoggerBase
    from forkless.v1.metrics.loggers import PerEngineStatLoggerFactory, StatLoggerFactory

    assert StatLoggerFactory is PerEngineStatLoggerFactory
    assert get_args(StatLoggerFactory)[-1] is StatLoggerBase


def test_a_plugin_subclasses_a_built_in_parser_from_its_vllm_module() -> None:
    """vLLM's parsers live in ``*_reasoning_parser`` / ``*_tool_parser`` modules; a plugin
    that subclasses one (other think tags) imports it from there."""
    from forkless.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
    from forkless.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser
    from forkless.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser
    from forkless.tool_parsers.llama_tool_parser import Llama3JsonToolParser

    import forkless.reasoning.deepseek_r1 as r1
    import forkless.reasoning.qwen3 as qwen3
    import forkless.tool_parsers.hermes as hermes
    import forkless.tool_parsers.llama3_json as llama3_json

    assert (DeepSeekR1ReasoningParser, Qwen3ReasoningParser, Hermes2ProToolParser, Llama3JsonToolParser) == (
        r1.DeepSeekR1ReasoningParser, qwen3.Qwen3ReasoningParser, hermes.Hermes2ProToolParser,
        llama3_json.Llama3JsonToolParser)

    class SeedThink(DeepSeekR1ReasoningParser):
        @property
        def start_token(self) -> str:
            return "<seed:think>"

        @property
        def end_token(self) -> str:
            return "</seed:think>"

    assert SeedThink(None).extract_reasoning("<seed:think>hm</seed:think>ok", None) == ("hm", "ok")


def test_async_llm_from_a_whole_config(tiny_llama: Path) -> None:
    from forkless.config import EngineArgs
    from forkless.metrics import LoggingStatLogger
    from forkless.v1.engine.async_llm import AsyncLLM

    config = EngineArgs(model=str(tiny_llama), max_model_len=128).create_engine_config()
    engine = AsyncLLM.from_vllm_config(config, enable_log_requests=True, disable_log_stats=True)
    assert engine.config is config and engine.log_requests
    assert not any(isinstance(s, LoggingStatLogger) for s in engine.stat_loggers)
    with pytest.raises(ValueError, match="start_engine_loop=False"):
        AsyncLLM.from_vllm_config(config, start_engine_loop=False)
