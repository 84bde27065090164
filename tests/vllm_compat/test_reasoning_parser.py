"""A reasoning parser written for vLLM, imports renamed only, works in forkless.

``vllm_style_reasoning_parser.py`` is loaded the way ``--reasoning-parser-plugin FILE``
loads it, then found by name and driven the way the server drives it (the served check,
with a real ``forkless serve``, is in ``test_tool_parser.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from forkless.entrypoints.openai.chat_parsing import make_choice_parser
from forkless.protocol.openai import ChatCompletionRequest
from forkless.reasoning import ReasoningParser, ReasoningParserManager

HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "vllm_style_reasoning_parser.py"
NAME = "vllm_style_thought"

# Where vLLM plugin authors import from (vLLM 0.33, and the paths of earlier releases that
# parsers still use); each forkless import of a sample, renamed back, must be one of them.
VLLM_PATHS = {
    "vllm.reasoning", "vllm.reasoning.abs_reasoning_parsers", "vllm.reasoning.basic_parsers",
    "vllm.tool_parsers", "vllm.tool_parsers.abstract_tool_parser", "vllm.entrypoints.openai.tool_parsers",
    "vllm.entrypoints.generate.base.protocol",  # vLLM 0.31 on
    "vllm.entrypoints.openai.engine.protocol",  # vLLM 0.1x-0.30 (and vLLM's docs)
    "vllm.entrypoints.openai.chat_completion.protocol", "vllm.entrypoints.openai.responses.protocol",
    "vllm.entrypoints.chat_utils", "vllm.renderers.chat_utils", "vllm.tokenizers", "vllm.logger",
}


def renamed_imports(path: Path) -> set[str]:
    """The modules a sample imports from forkless, spelled as vLLM spells them."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {"vllm" + n[len("forkless"):] for n in names if n == "forkless" or n.startswith("forkless.")}
    return found


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


@pytest.fixture(scope="module")
def plugin():
    ReasoningParserManager.import_reasoning_parser(str(PLUGIN))  # what --reasoning-parser-plugin does
    yield ReasoningParserManager.get_reasoning_parser(NAME)
    ReasoningParserManager.registry.unregister(NAME)


def request(**kwargs) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "Weather in Paris?"}], **kwargs)


def stream(parser, chunks: list[str]) -> tuple[str | None, str | None]:
    """What a client receives, step by step and topped up at the end, as the server sends it."""
    text, deltas = "", []
    for chunk in chunks:
        text += chunk
        deltas.append(parser.step(text, []))
    deltas.append(parser.finish(text))
    sent = [d for d in deltas if d is not None]
    return "".join(d.reasoning or "" for d in sent) or None, "".join(d.content or "" for d in sent) or None


def test_the_sample_imports_only_vllms_paths_renamed() -> None:
    assert renamed_imports(PLUGIN) <= VLLM_PATHS, renamed_imports(PLUGIN) - VLLM_PATHS


def test_the_plugin_file_registers_its_parser(plugin) -> None:
    assert NAME in ReasoningParserManager.list_registered()
    assert plugin.__name__ == "ThoughtReasoningParser" and issubclass(plugin, ReasoningParser)


@pytest.mark.parametrize("output, reasoning, content", [
    ("[THOUGHT]The user wants Paris.[/THOUGHT]It is sunny.", "The user wants Paris.", "It is sunny."),
    ("[THOUGHT]Cut off while thinking", "Cut off while thinking", None),
    ("No thought at all.", None, "No thought at all."),
])
def test_whole_and_streamed_output_through_forkless(plugin, tokenizer, output, reasoning, content) -> None:
    whole = make_choice_parser(request(), tokenizer, NAME, None).parse_whole(output)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    ids = tokenizer.encode(output, add_special_tokens=False)
    tokens = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    by_token = [b[len(a):] for a, b in zip(tokens, tokens[1:])]
    for chunks in (list(output), by_token, [output]):
        assert stream(make_choice_parser(request(), tokenizer, NAME, None), chunks) == (reasoning, content)


def test_chat_template_kwargs_reach_the_constructor(plugin, tokenizer) -> None:
    output = "[THOUGHT]hidden[/THOUGHT]answer"
    off = make_choice_parser(request(chat_template_kwargs={"thinking": False}), tokenizer, NAME, None)
    assert (off.parse_whole(output).reasoning, off.parse_whole(output).content) == (None, output)


def test_token_id_methods_and_vocab(plugin, tokenizer) -> None:
    parser = ReasoningParserManager.create(NAME, tokenizer, chat_template_kwargs={})
    ids = tokenizer.encode("[THOUGHT]x[/THOUGHT] Done", add_special_tokens=False)
    assert parser.is_reasoning_end(ids) and not parser.is_reasoning_end(ids[:3])
    assert tokenizer.decode(parser.extract_content_ids(ids)).strip() == "Done"
    assert parser.vocab == tokenizer.get_vocab()
    assert parser.prepare_structured_tag(None, None) is None and parser.prepare_structured_tag("tag", None) == "tag"


def test_the_parser_gets_the_model_config_and_sees_an_open_prompt(plugin, tokenizer) -> None:
    from forkless.config import ModelConfig

    config = ModelConfig(model="m", tokenizer="m", served_model_name="m", architecture="LlamaForCausalLM",
                         dtype="float32", max_model_len=321, vocab_size=10)
    choice = make_choice_parser(request(), tokenizer, NAME, None, config)
    assert choice.reasoning.max_model_len == 321 and choice.reasoning.prompt_len is None
    choice.set_prompt(tokenizer.encode("Think first: [THOUGHT]", add_special_tokens=False))
    assert choice.reasoning.prompt_len is not None  # the prompt left the reasoning open
    closed = make_choice_parser(request(), tokenizer, NAME, None, config)
    closed.set_prompt(tokenizer.encode("[THOUGHT]x[/THOUGHT]", add_special_tokens=False))
    assert closed.reasoning is None  # the prompt ended it: the output is all content


def test_adjust_request_returns_the_request_to_use(plugin, tokenizer) -> None:
    parser = ReasoningParserManager.create(NAME, tokenizer)
    plain = request()
    assert parser.adjust_request(plain) is plain
    adjusted = parser.adjust_request(request(chat_template_kwargs={"answer_stop": "Rome"}))
    assert adjusted.stop == ["Rome"]
