"""Chat templates: what reaches the template, ``--chat-template``, and models without one."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import openai
import pytest

from forkless.config import EngineArgs
from forkless.engine.processor import NoChatTemplateError, Processor
from tests.server.conftest import start_server
from tests.server.force_tokens import PATH as FORCE
from tests.server.test_chat_tools import WEATHER_TOOL, collect_stream, forced

HERE = Path(__file__).resolve().parent
# Shows every input a chat template can get, so the rendered prompt proves it arrived.
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if tools %}<tools>{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}</tools>{% endif %}"
    "{% if documents %}<docs>{% for d in documents %}{{ d.title }}={{ d.text }};{% endfor %}</docs>{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}"
    "{% if reasoning_effort is defined and reasoning_effort %}<effort={{ reasoning_effort }}>{% endif %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def without_template(src: Path, dst: Path) -> Path:
    """A copy of a model folder whose tokenizer has no chat template."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "chat_template.jinja":
            continue
        if f.name == "tokenizer_config.json":
            cfg = json.loads(f.read_text())
            cfg.pop("chat_template", None)
            (dst / f.name).write_text(json.dumps(cfg))
        elif f.suffix == ".safetensors":
            os.symlink(f, dst / f.name)
        else:
            shutil.copy(f, dst / f.name)
    return dst


@pytest.fixture(scope="module")
def bare_model(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return without_template(tiny_llama, tmp_path_factory.mktemp("bare") / "model")


@pytest.fixture(scope="module")
def processor(bare_model: Path) -> Processor:
    return Processor(EngineArgs(model=str(bare_model)).create_engine_config())


def test_tools_documents_and_template_kwargs_reach_the_template(processor: Processor) -> None:
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": "Hi"}], chat_template=TEMPLATE, tools=[WEATHER_TOOL],
        documents=[{"title": "Paris", "text": "sunny"}], chat_template_kwargs={"enable_thinking": False})
    assert prompt["prompt"] == "[user]Hi<tools>get_weather</tools><docs>Paris=sunny;</docs><no_think>[assistant]"
    assert processor.tokenizer.decode(prompt["prompt_token_ids"]) == prompt["prompt"]


def test_continue_final_message_leaves_the_last_turn_open(processor: Processor) -> None:
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    prompt = processor.apply_chat_template(messages, chat_template=template, continue_final_message=True)
    assert prompt["prompt"] == "<user>Hi</user><assistant>Hello, I am"


def test_chat_template_flag_takes_a_file_or_the_template_itself(tmp_path: Path) -> None:
    from forkless.entrypoints.openai.chat_options import load_chat_template

    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert load_chat_template(str(tmp_path / "t.jinja")) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE


def test_a_template_that_rejects_the_messages_is_a_value_error(processor: Processor) -> None:
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('a system message comes first') }}{% endif %}"
    with pytest.raises(ValueError, match="failed to render the messages: a system message comes first"):
        processor.apply_chat_template([{"role": "user", "content": "Hi"}], chat_template=template)
    with pytest.raises(ValueError, match="failed to render"):
        processor.apply_chat_template([{"role": "user", "content": "Hi"}], chat_template="{{ 1 + messages[0].content }}")


def test_content_parts_and_null_content_become_text(processor: Processor) -> None:
    # OpenAI clients send content as a list of parts, and null content on an assistant turn
    # that only called tools; templates take one string (vLLM joins text parts by newlines).
    template = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "user", "content": []}]
    prompt = processor.apply_chat_template(messages, chat_template=template, add_generation_prompt=False)
    assert prompt["prompt"] == "[user:Hi\nthere][assistant:][user:]"
    assert messages[0]["content"][0] == {"type": "text", "text": "Hi"}  # the caller's messages are untouched
    image = [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                          {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[1\] has type 'image_url', which forkless "
                                         "does not support"):
        processor.apply_chat_template(image, chat_template=template)
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\] is not a content part"):
        processor.apply_chat_template([{"role": "user", "content": ["Hi"]}], chat_template=template)


def test_tool_call_arguments_reach_the_template_as_a_mapping(processor: Processor) -> None:
    # OpenAI clients send an earlier call's arguments as a JSON string; templates iterate a
    # mapping (Hugging Face's tool-use convention). Offline LLM.chat and the server alike.
    template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}<{{ c.function.name }}"
                "{% for k, v in c.function.arguments | dictsort %} {{ k }}={{ v }}{% endfor %}>{% endfor %}"
                "{% endfor %}")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 2, "a": "x"}'}}
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    prompt = processor.apply_chat_template(messages, chat_template=template, add_generation_prompt=False)
    assert prompt["prompt"] == "<f a=x b=2>"
    assert call["function"]["arguments"] == '{"b": 2, "a": "x"}'  # the caller's message is untouched
    # A string that is not a JSON object stays as it is, for the template to show.
    show = "{% for m in messages %}{% for c in m.tool_calls or [] %}[{{ c.function.arguments }}]{% endfor %}{% endfor %}"
    for raw in ("not json", "[1, 2]"):
        messages[1]["tool_calls"] = [{**call, "function": {"name": "f", "arguments": raw}}]
        assert processor.apply_chat_template(messages, chat_template=show,
                                             add_generation_prompt=False)["prompt"] == f"[{raw}]"


def test_no_template_is_a_clear_error_in_process(processor: Processor) -> None:
    with pytest.raises(NoChatTemplateError, match="has no chat template"):
        processor.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_model_without_template_answers_400_on_chat(bare_model: Path, tmp_path: Path) -> None:
    srv = start_server(bare_model, tmp_path)
    try:
        client = srv.client()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=client.models.list().data[0].id,
                                           messages=[{"role": "user", "content": "Hi"}])
        assert "no chat template" in str(info.value) and "--chat-template" in str(info.value)
        # Tools with the default tool_choice need the server's tool parser flags.
        with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
            client.chat.completions.create(model=client.models.list().data[0].id, tools=[WEATHER_TOOL],
                                           messages=[{"role": "user", "content": "Hi"}])
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


PLUGIN = textwrap.dedent('''
    """A tool parser plugin file: one call per line, written as ``CALL name {json}``."""
    import re

    from forkless.tool_parsers import (DeltaFunctionCall, DeltaMessage, DeltaToolCall,
                                       ExtractedToolCallInformation, FunctionCall, ToolCall,
                                       ToolParser, ToolParserManager)

    LINE = re.compile(r"^CALL (\\w+) (\\{.*\\})\\n", re.M)


    @ToolParserManager.register_module("call_lines")
    class CallLinesToolParser(ToolParser):
        def extract_tool_calls(self, model_output, request):
            calls = [ToolCall(function=FunctionCall(name=m[1], arguments=m[2])) for m in LINE.finditer(model_output)]
            return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls,
                                                content=LINE.sub("", model_output) if calls else model_output)

        def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, previous_token_ids,
                                         current_token_ids, delta_token_ids, request):
            done = len(LINE.findall(previous_text))
            new = [DeltaToolCall(index=i, id=f"chatcmpl-tool-{i}", type="function",
                                 function=DeltaFunctionCall(name=m[1], arguments=m[2]))
                   for i, m in enumerate(LINE.finditer(current_text)) if i >= done]
            return DeltaMessage(tool_calls=new) if new else None
''')


def test_chat_template_file_and_tool_parser_plugin_file(bare_model: Path, tmp_path: Path, tokenizer) -> None:
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    (tmp_path / "my_parser.py").write_text(PLUGIN)
    srv = start_server(bare_model, tmp_path, "--chat-template", str(tmp_path / "template.jinja"),
                       "--tool-parser-plugin", str(tmp_path / "my_parser.py"), "--tool-call-parser", "call_lines",
                       "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_r1", "--logits-processors", FORCE,
                       "--exclude-tools-when-tool-choice-none", env_extra={"PYTHONPATH": str(HERE)})
    try:
        client = srv.client()
        model = client.models.list().data[0].id
        text = 'Paris needs a lookup.</think>CALL get_weather {"city": "Paris"}\n'
        kwargs = dict(model=model, messages=[{"role": "user", "content": "Hi"}], tools=[WEATHER_TOOL],
                      extra_body={**forced(tokenizer, text), "documents": [{"title": "Paris", "text": "sunny"}]})
        resp = client.chat.completions.create(**kwargs)
        expected_prompt = "[user]Hi<tools>get_weather</tools><docs>Paris=sunny;</docs>[assistant]"
        assert resp.usage.prompt_tokens == len(tokenizer.encode(expected_prompt, add_special_tokens=False))
        message = resp.choices[0].message
        assert message.reasoning_content == "Paris needs a lookup."
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == \
            [("get_weather", '{"city": "Paris"}')]
        assert resp.choices[0].finish_reason == "tool_calls"
        streamed = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        assert streamed["reasoning"] == "Paris needs a lookup."
        assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == \
            [("get_weather", '{"city": "Paris"}')]
        assert streamed["finish"] == "tool_calls"
        # reasoning_effort reaches the template, with enable_thinking off for "none" (as vLLM
        # gives them) unless chat_template_kwargs says otherwise.
        for effort, template_kwargs, shown in [("none", None, "<no_think><effort=none>"), ("high", None, "<effort=high>"),
                                               ("none", {"enable_thinking": True}, "<effort=none>")]:
            resp = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, reasoning_effort=effort,
                extra_body={"chat_template_kwargs": template_kwargs} if template_kwargs else None)
            assert resp.usage.prompt_tokens == len(tokenizer.encode(f"[user]Hi{shown}[assistant]",
                                                                     add_special_tokens=False)), effort
        # --exclude-tools-when-tool-choice-none: tool_choice "none" renders without the tools,
        # any other choice with them; the Responses API keeps them, as in vLLM.
        for choice, shown in (("none", ""), ("auto", "<tools>get_weather</tools>"),
                              ("required", "<tools>get_weather</tools>")):
            resp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=1, tools=[WEATHER_TOOL], tool_choice=choice)
            assert resp.usage.prompt_tokens == len(tokenizer.encode(f"[user]Hi{shown}[assistant]",
                                                                     add_special_tokens=False)), choice
        r = client.responses.create(model=model, input="Hi", max_output_tokens=1, tool_choice="none",
                                    tools=[{"type": "function", **WEATHER_TOOL["function"]}])
        assert r.usage.input_tokens == len(tokenizer.encode("[user]Hi<tools>get_weather</tools>[assistant]",
                                                            add_special_tokens=False))
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                           extra_body={"reasoning_effort": "huge"})
        assert info.value.body["param"] == "reasoning_effort"
        r = client.responses.create(model=model, input="Hi", max_output_tokens=1, reasoning={"effort": "low"})
        assert r.reasoning.effort == "low"
        assert r.usage.input_tokens == len(tokenizer.encode("[user]Hi<effort=low>[assistant]", add_special_tokens=False))
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)
