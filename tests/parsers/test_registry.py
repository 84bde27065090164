"""Registering, finding and importing parsers through the two managers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from forkless.plugins import PluginImportError, RegistryError
from forkless.protocol.openai import DeltaMessage, ExtractedToolCallInformation
from forkless.reasoning import ReasoningParser, ReasoningParserManager
from forkless.tool_parsers import ToolParser, ToolParserManager
from tests.conftest import plugin_env, run_python


@pytest.fixture
def cleanup():
    names: list[tuple[type, str]] = []
    yield names
    for manager, name in names:
        manager.registry.unregister(name)


def test_built_ins_are_registered_by_path_and_imported_on_first_use(tmp_path: Path) -> None:
    proc = run_python(textwrap.dedent("""
        import sys
        from forkless.tool_parsers import ToolParserManager
        from forkless.reasoning import ReasoningParserManager
        print(ToolParserManager.list_registered(), ReasoningParserManager.list_registered())
        print("forkless.tool_parsers.hermes" in sys.modules, "forkless.reasoning.qwen3" in sys.modules)
        ToolParserManager.get_tool_parser("hermes"); ReasoningParserManager.get_reasoning_parser("qwen3")
        print("forkless.tool_parsers.hermes" in sys.modules, "forkless.reasoning.qwen3" in sys.modules)
        print("torch" in sys.modules, "transformers" in sys.modules)
    """), plugin_env(None, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "['hermes', 'llama3_json'] ['deepseek_r1', 'qwen3']", "False False", "True True", "False False"]


class NoCalls(ToolParser):
    def extract_tool_calls(self, model_output, request):
        return ExtractedToolCallInformation(tools_called=False, content=model_output)

    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, previous_token_ids,
                                     current_token_ids, delta_token_ids, request):
        return DeltaMessage(content=delta_text)


class NoReasoning(ReasoningParser):
    def extract_reasoning(self, model_output, request):
        return None, model_output

    def extract_reasoning_streaming(self, previous_text, current_text, delta_text, previous_token_ids,
                                    current_token_ids, delta_token_ids):
        return DeltaMessage(content=delta_text)


def test_register_module_as_decorator_directly_and_by_path(cleanup) -> None:
    @ToolParserManager.register_module("test_decorated")
    class Decorated(NoCalls):
        pass

    class Direct(NoReasoning):
        pass

    cleanup += [(ToolParserManager, "test_decorated"), (ReasoningParserManager, "test_direct"),
                (ToolParserManager, "test_by_path")]
    assert ReasoningParserManager.register_module("test_direct", module=Direct) is Direct
    ToolParserManager.register_lazy_module("test_by_path", "forkless.tool_parsers.hermes:Hermes2ProToolParser")
    assert ToolParserManager.get_tool_parser("test_decorated") is Decorated
    assert ReasoningParserManager.get_reasoning_parser("test_direct") is Direct
    assert ToolParserManager.get_tool_parser("test_by_path").__name__ == "Hermes2ProToolParser"


@pytest.mark.parametrize("manager, module, cls", [
    (ToolParserManager, "forkless.tool_parsers.llama3_json", "Llama3JsonToolParser"),
    (ReasoningParserManager, "forkless.reasoning.qwen3", "Qwen3ReasoningParser"),
])
def test_register_lazy_module_takes_vllms_three_arguments(cleanup, manager, module, cls) -> None:
    cleanup += [(manager, "test_positional"), (manager, "test_keywords"), (manager, "test_one_string")]
    manager.register_lazy_module("test_positional", module, cls)
    manager.register_lazy_module(name="test_keywords", module_path=module, class_name=cls)
    manager.register_lazy_module("test_one_string", f"{module}:{cls}")  # forkless's form too
    assert {"test_positional", "test_keywords", "test_one_string"} <= set(manager.list_registered())
    assert manager.list_registered() == sorted(manager.list_registered())
    classes = {manager.get(n) for n in ("test_positional", "test_keywords", "test_one_string")}
    assert len(classes) == 1 and classes.pop().__name__ == cls


def test_register_module_with_several_names_and_vllms_argument_checks(cleanup) -> None:
    cleanup += [(ReasoningParserManager, "test_a"), (ReasoningParserManager, "test_b"),
                (ReasoningParserManager, "NoReasoning")]
    ReasoningParserManager.register_module(["test_a", "test_b"], module=NoReasoning)
    ReasoningParserManager.register_module(module=NoReasoning)  # under its class name
    assert {ReasoningParserManager.get(n) for n in ("test_a", "test_b", "NoReasoning")} == {NoReasoning}
    with pytest.raises(TypeError, match="force must be a boolean"):
        ReasoningParserManager.register_module("test_a", force="yes", module=NoReasoning)
    with pytest.raises(TypeError, match="name must be str, list"):
        ReasoningParserManager.register_module(3, module=NoReasoning)


def test_a_parser_missing_a_method_is_refused_with_the_names(cleanup) -> None:
    @ToolParserManager.register_module("test_incomplete")
    class Incomplete(ToolParser):
        def extract_tool_calls(self, model_output, request):
            return ExtractedToolCallInformation(tools_called=False, content=model_output)

    cleanup.append((ToolParserManager, "test_incomplete"))
    with pytest.raises(TypeError, match="'test_incomplete' .*Incomplete.* does not implement "
                                        "extract_tool_calls_streaming"):
        ToolParserManager.get_tool_parser("test_incomplete")


def test_a_plugin_file_can_register_itself_by_its_file_name(tmp_path: Path, cleanup) -> None:
    # The form of vLLM's docs: the file names its own module, which vLLM imports by file name.
    plugin = tmp_path / "my_lazy_reasoning.py"
    plugin.write_text(textwrap.dedent("""
        from forkless.reasoning import ReasoningParserManager
        from forkless.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser

        class LazyParser(DeepSeekR1ReasoningParser):
            pass

        ReasoningParserManager.register_lazy_module(
            name="test_lazy_file", module_path="my_lazy_reasoning", class_name="LazyParser")
    """))
    cleanup.append((ReasoningParserManager, "test_lazy_file"))
    ReasoningParserManager.import_reasoning_parser(str(plugin))
    parser = ReasoningParserManager.create("test_lazy_file", None, chat_template_kwargs={})
    assert type(parser).__name__ == "LazyParser"
    assert parser.extract_reasoning("a</think>b", None) == ("a", "b")


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(RegistryError, match=r"unknown tool parser 'nope'; registered: .*hermes, llama3_json"):
        ToolParserManager.get_tool_parser("nope")
    with pytest.raises(RegistryError, match=r"registered: .*deepseek_r1, qwen3"):
        ReasoningParserManager.get_reasoning_parser("nope")


def test_a_class_that_is_not_a_parser_is_refused(cleanup) -> None:
    cleanup.append((ToolParserManager, "test_not_a_parser"))
    ToolParserManager.register_lazy_module("test_not_a_parser", "forkless.reasoning.qwen3:Qwen3ReasoningParser")
    with pytest.raises(TypeError, match="not a subclass of forkless.tool_parsers.interface.ToolParser"):
        ToolParserManager.get_tool_parser("test_not_a_parser")


def test_plugin_file_registers_its_parser(tmp_path: Path, cleanup) -> None:
    plugin = tmp_path / "my_reasoning.py"
    plugin.write_text(textwrap.dedent("""
        from forkless.reasoning import ReasoningParserManager
        from forkless.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser

        @ReasoningParserManager.register_module("test_file_parser")
        class FileParser(DeepSeekR1ReasoningParser):
            pass
    """))
    cleanup.append((ReasoningParserManager, "test_file_parser"))
    ReasoningParserManager.import_reasoning_parser(str(plugin))
    ReasoningParserManager.import_reasoning_parser(str(plugin))  # a second import changes nothing
    parser = ReasoningParserManager.get_reasoning_parser("test_file_parser")(None)
    assert parser.extract_reasoning("a</think>b", None) == ("a", "b")


def test_plugin_file_that_fails_reports_its_traceback(tmp_path: Path) -> None:
    plugin = tmp_path / "broken_parser.py"
    plugin.write_text("import json\n\ndef helper():\n    return 1 / 0\n\nhelper()\n")
    with pytest.raises(PluginImportError) as info:
        ToolParserManager.import_tool_parser(str(plugin))
    message = str(info.value)
    assert "--tool-parser-plugin" in message and "ZeroDivisionError" in message
    assert "broken_parser.py\", line 4, in helper" in message
    with pytest.raises(PluginImportError, match="no such file"):
        ToolParserManager.import_tool_parser(str(tmp_path / "missing.py"))
    with pytest.raises(PluginImportError, match="No module named 'no_such_parser_module'"):
        ToolParserManager.import_tool_parser("no_such_parser_module")
