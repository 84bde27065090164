"""Registering, finding and importing parsers through the two managers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from forkless.plugins import PluginImportError, RegistryError
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


def test_register_module_as_decorator_directly_and_by_path(cleanup) -> None:
    @ToolParserManager.register_module("test_decorated")
    class Decorated(ToolParser):
        pass

    class Direct(ReasoningParser):
        pass

    cleanup += [(ToolParserManager, "test_decorated"), (ReasoningParserManager, "test_direct"),
                (ToolParserManager, "test_by_path")]
    assert ReasoningParserManager.register_module("test_direct", module=Direct) is Direct
    ToolParserManager.register_lazy_module("test_by_path", "forkless.tool_parsers.hermes:Hermes2ProToolParser")
    assert ToolParserManager.get_tool_parser("test_decorated") is Decorated
    assert ReasoningParserManager.get_reasoning_parser("test_direct") is Direct
    assert ToolParserManager.get_tool_parser("test_by_path").__name__ == "Hermes2ProToolParser"


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
    assert parser.extract_reasoning_content("a</think>b", None) == ("a", "b")


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
