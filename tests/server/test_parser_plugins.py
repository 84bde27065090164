"""Parsers from plugin packages, and the start-up errors for bad parser settings."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.conftest import plugin_env, run_forkless
from tests.server.conftest import start_server
from tests.server.force_tokens import PATH as FORCE
from tests.server.test_chat_tools import MESSAGES, WEATHER_TOOL, collect_stream, forced

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def test_parser_registered_by_a_general_plugin_package(tiny_llama: Path, plugin_site: Path, tmp_path: Path,
                                                       tokenizer) -> None:
    srv = start_server(tiny_llama, tmp_path, "--tool-call-parser", "function_tag", "--enable-auto-tool-choice",
                       "--logits-processors", FORCE, site=plugin_site,
                       env_extra={"PYTHONPATH": os.pathsep.join([str(plugin_site), str(HERE)]),
                                  "FORKLESS_PLUGINS": "example_tool_parser"})
    try:
        client = srv.client()
        text = 'Checking. <function=get_weather>{"city": "Paris"}</function>'
        kwargs = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=[WEATHER_TOOL],
                      extra_body=forced(tokenizer, text))
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == \
            [("get_weather", '{"city": "Paris"}')]
        assert choice.message.content == "Checking. " and choice.finish_reason == "tool_calls"
        streamed = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        assert streamed["content"] == "Checking. " and streamed["finish"] == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == \
            [("get_weather", '{"city": "Paris"}')]
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


FAILING_PARSER = '''
from forkless.protocol.openai import DeltaMessage, ExtractedToolCallInformation
from forkless.tool_parsers import ToolParser, ToolParserManager


@ToolParserManager.register_module("fails_on_boom")
class FailsOnBoom(ToolParser):
    def extract_tool_calls(self, model_output, request):
        return ExtractedToolCallInformation(tools_called=False, content=model_output)

    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, *args):
        if "BOOM" in current_text:
            raise IndexError("list index out of range")  # as ported vLLM parsers do on odd output
        return DeltaMessage(content=delta_text)
'''


def test_a_parser_that_fails_mid_stream_ends_the_stream_with_an_error_event(tiny_llama: Path, tmp_path: Path,
                                                                             tokenizer) -> None:
    # The connection used to drop without a word (the openai client raised httpx's
    # "peer closed connection without sending complete message body").
    (tmp_path / "failing_parser.py").write_text(FAILING_PARSER)
    srv = start_server(tiny_llama, tmp_path, "--tool-parser-plugin", str(tmp_path / "failing_parser.py"),
                       "--tool-call-parser", "fails_on_boom", "--enable-auto-tool-choice", "--logits-processors", FORCE,
                       env_extra={"PYTHONPATH": str(HERE)})
    try:
        client = srv.client()
        stream = client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                                tools=[WEATHER_TOOL], stream=True,
                                                extra_body=forced(tokenizer, "It went BOOM there."))
        with pytest.raises(openai.APIError, match="internal error: IndexError: list index out of range"):
            for _ in stream:
                pass
        assert "chat stream failed" in srv.log()
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


@pytest.mark.parametrize("flags, expected", [
    (["--tool-call-parser", "hermez", "--enable-auto-tool-choice"],
     "--tool-call-parser: unknown tool parser 'hermez'; registered: hermes, llama3_json"),
    (["--reasoning-parser", "qwen"], "--reasoning-parser: unknown reasoning parser 'qwen'; registered: deepseek_r1, qwen3"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser NAME"),
    (["--chat-template", "no/such/template.jinja"], "--chat-template no/such/template.jinja: no such file"),
    (["--chat-template", "{% for m in messages %}"], "Jinja syntax error"),
])
def test_bad_parser_settings_stop_the_server_at_start(tiny_llama: Path, tmp_path: Path, flags, expected) -> None:
    proc = run_forkless(["serve", str(tiny_llama), *flags], plugin_env(None, tmp_path, FORKLESS_PLUGINS=""),
                        timeout=120)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr[-3000:]


def test_a_plugin_file_that_fails_to_import_stops_the_server_with_its_traceback(tiny_llama: Path,
                                                                                 tmp_path: Path) -> None:
    plugin = tmp_path / "bad_reasoning.py"
    plugin.write_text("from forkless.reasoning import ReasoningParserManager\n\nraise RuntimeError('config missing')\n")
    proc = run_forkless(["serve", str(tiny_llama), "--reasoning-parser-plugin", str(plugin),
                         "--reasoning-parser", "mine"], plugin_env(None, tmp_path, FORKLESS_PLUGINS=""), timeout=120)
    assert proc.returncode == 2
    assert f"--reasoning-parser-plugin {plugin} failed to import: RuntimeError: config missing" in proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr and 'bad_reasoning.py", line 3' in proc.stderr
