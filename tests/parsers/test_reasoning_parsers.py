"""The built-in reasoning parsers: vLLM's API and behaviour, whole and streamed in every split.

The expected splits are vLLM's (``deepseek_r1``, ``qwen3``): see ``recorded.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from forkless.protocol.openai import DeltaMessage
from forkless.reasoning import ReasoningParser, ReasoningParserManager
from forkless.reasoning.basic_parsers import BaseThinkingReasoningParser
from forkless.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from forkless.reasoning.qwen3 import Qwen3ReasoningParser
from tests.parsers.recorded import DEEPSEEK_R1, QWEN3, QWEN3_NO_THINKING
from tests.parsers.streaming import every_char, stream_reasoning, token_chunks, two_way_splits

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
CASES = ([("qwen3", {}, *c) for c in QWEN3] + [("qwen3", NO_THINKING, *c) for c in QWEN3_NO_THINKING]
         + [("deepseek_r1", {}, *c) for c in DEEPSEEK_R1])
IDS = ([f"qwen3-{i}" for i in range(len(QWEN3))] + [f"qwen3-no-thinking-{i}" for i in range(len(QWEN3_NO_THINKING))]
       + [f"deepseek_r1-{i}" for i in range(len(DEEPSEEK_R1))])


def make(name: str, tokenizer: Any = None, **kwargs: Any) -> ReasoningParser:
    return ReasoningParserManager.create(name, tokenizer, **kwargs)


def settled_while_streaming(output: str, content: str | None) -> bool:
    """Whether a bare parser streams the whole result. A tag cut at the end ("</thi") is
    held back, and so is the call after an implicit ``<tool_call>`` end (a ``</think>``
    could still follow): the server's end-of-stream top-up settles those
    (``test_choice_parser.py``)."""
    return not output.endswith("</thi") and not (content or "").startswith("<tool_call>")


def normalized(reasoning: str | None, content: str | None) -> tuple[str | None, str | None]:
    """A stream cannot send an empty string: compare ``""`` as ``None``."""
    return reasoning or None, content or None


def prefix_of(part: str | None, whole: str | None) -> bool:
    return (whole or "").startswith(part or "")


@pytest.mark.parametrize("name, kwargs, output, reasoning, content", CASES, ids=IDS)
def test_whole_output(name, kwargs, output, reasoning, content) -> None:
    assert make(name, **kwargs).extract_reasoning(output, None) == (reasoning, content)


@pytest.mark.parametrize("name, kwargs, output, reasoning, content", CASES, ids=IDS)
def test_streamed_one_character_at_a_time_adds_up_to_whole(name, kwargs, output, reasoning, content) -> None:
    streamed = stream_reasoning(make(name, **kwargs), every_char(output))
    if settled_while_streaming(output, content):
        assert streamed == normalized(reasoning, content)
    else:
        assert prefix_of(streamed[0], reasoning) and prefix_of(streamed[1], content)


@pytest.mark.parametrize("name, kwargs, output, reasoning, content", CASES, ids=IDS)
def test_streamed_in_two_pieces_at_every_boundary_adds_up_to_whole(name, kwargs, output, reasoning, content) -> None:
    for chunks in two_way_splits(output):
        streamed = stream_reasoning(make(name, **kwargs), chunks)
        if settled_while_streaming(output, content):
            assert streamed == normalized(reasoning, content), chunks
        else:
            assert prefix_of(streamed[0], reasoning) and prefix_of(streamed[1], content), chunks


@pytest.mark.parametrize("name, kwargs, output, reasoning, content", CASES, ids=IDS)
def test_streamed_token_by_token_adds_up_to_whole(name, kwargs, output, reasoning, content, tokenizer) -> None:
    if not output:
        return
    streamed = stream_reasoning(make(name, tokenizer, **kwargs), token_chunks(tokenizer, output))
    if settled_while_streaming(output, content):
        assert streamed == normalized(reasoning, content)


def test_qwen3_holds_a_tool_call_back_while_it_may_still_be_reasoning() -> None:
    parser = make("qwen3")
    text = 'Need data.<tool_call>\n{"name": "f", "arguments": {}}</tool_call>'
    # While streaming, the call is neither reasoning nor (yet) content ...
    assert stream_reasoning(parser, every_char(text)) == ("Need data.", None)
    # ... because a later </think> makes it reasoning after all, as vLLM's whole-output split has it.
    assert make("qwen3").extract_reasoning(text + "</think>Done.", None) == (text, "Done.")


def test_constructors_take_vllms_arguments(tokenizer) -> None:
    # vLLM passes chat_template_kwargs to every reasoning parser; the base takes *args, **kwargs.
    assert isinstance(DeepSeekR1ReasoningParser(tokenizer, "extra", chat_template_kwargs={}, other=1),
                      DeepSeekR1ReasoningParser)
    assert Qwen3ReasoningParser(tokenizer, chat_template_kwargs={"enable_thinking": False}).thinking_enabled is False
    assert Qwen3ReasoningParser(tokenizer, chat_template_kwargs={"enable_thinking": True}).thinking_enabled is True
    assert Qwen3ReasoningParser(tokenizer).thinking_enabled is True
    assert Qwen3ReasoningParser(tokenizer, chat_template_kwargs=None).thinking_enabled is True
    assert Qwen3ReasoningParser(tokenizer, chat_template_kwargs={"enable_thinking": None}).thinking_enabled is False
    parser = make("deepseek_r1", tokenizer)
    assert parser.vocab == tokenizer.get_vocab() and parser.model_tokenizer is tokenizer


def test_is_reasoning_end_and_content_ids_with_multi_token_tags(tokenizer) -> None:
    parser = make("deepseek_r1", tokenizer)
    assert len(tokenizer.encode("</think>", add_special_tokens=False)) > 1  # SmolLM2 splits the tags
    assert parser.start_token_id is None and parser.end_token_id is None
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert parser.is_reasoning_end(enc("so 4.</think>The"))
    assert not parser.is_reasoning_end(enc("still thinking"))
    assert not parser.is_reasoning_end(enc("<think>a</think>b<think>c"))  # a new block was opened
    assert parser.is_reasoning_end_streaming(enc("so 4.</think>The"), enc("The"))
    ids = enc("Reasoning.</think> The answer is 4.")
    content = parser.extract_content_ids(ids)
    assert tokenizer.decode(content).strip() == "The answer is 4."
    assert "</think>" in tokenizer.decode(ids[: len(ids) - len(content)])
    assert parser.extract_content_ids(enc("no end yet")) == []


class OneTokenTags:
    """A tokenizer whose tags are single tokens (as in DeepSeek-R1's and Qwen3's vocabularies)."""

    VOCAB = {"<think>": 1, "</think>": 2, "a": 3, "b": 4, "c": 5}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.VOCAB)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in self.VOCAB.items()}
        return "".join(names[i] for i in ids)


def test_is_reasoning_end_and_content_ids_with_one_token_tags() -> None:
    parser = make("qwen3", OneTokenTags())
    assert (parser.start_token_id, parser.end_token_id) == (1, 2)
    assert parser.is_reasoning_end([1, 3, 2, 4])
    assert not parser.is_reasoning_end([1, 3])
    assert not parser.is_reasoning_end([1, 3, 2, 4, 1, 5])  # the last tag opens a block
    assert parser.is_reasoning_end([3, 2])  # the template opened the block
    assert parser.extract_content_ids([1, 3, 2, 4, 5]) == [4, 5]
    assert parser.extract_content_ids([1, 3, 2]) == []
    assert parser.extract_content_ids([1, 3]) == []


def test_old_method_names_still_work_and_warn_once(deprecations) -> None:
    parser = make("deepseek_r1")
    for _ in range(2):
        assert parser.extract_reasoning_content("a</think>b", None) == ("a", "b")
        delta = parser.extract_reasoning_content_streaming("", "a</think>b", "a</think>b", [], [], [])
        assert (delta.reasoning, delta.content) == ("a", "b")
    assert deprecations == [
        "Python API ReasoningParser.extract_reasoning_content is deprecated since forkless 0.1.0 and will be "
        "removed in 0.2.0; use ReasoningParser.extract_reasoning instead",
        "Python API ReasoningParser.extract_reasoning_content_streaming is deprecated since forkless 0.1.0 and "
        "will be removed in 0.2.0; use ReasoningParser.extract_reasoning_streaming instead",
    ]


def test_a_parser_written_against_the_old_names_still_works(deprecations) -> None:
    class OldStyle(ReasoningParser):
        def __init__(self, tokenizer):  # no *args, **kwargs: built without chat_template_kwargs
            super().__init__(tokenizer)

        def extract_reasoning_content(self, model_output, request):
            head, _, tail = model_output.partition("|")
            return head or None, tail or None

        def extract_reasoning_content_streaming(self, previous_text, current_text, delta_text,
                                                previous_token_ids, current_token_ids, delta_token_ids):
            if "|" in previous_text:
                return DeltaMessage(content=delta_text)
            head, bar, tail = delta_text.partition("|")
            return DeltaMessage(reasoning_content=head or None, content=tail or None)

    ReasoningParserManager.register_module("test_old_style", module=OldStyle)
    try:
        parser = make("test_old_style", chat_template_kwargs={"enable_thinking": True})
        assert parser.extract_reasoning("think|say", None) == ("think", "say")
        assert stream_reasoning(parser, ["thi", "nk|s", "ay"]) == ("think", "say")
        assert any("extract_reasoning_content is deprecated" in m for m in deprecations)
        assert any("DeltaMessage.reasoning_content is deprecated" in m and "use DeltaMessage.reasoning" in m
                   for m in deprecations)
    finally:
        ReasoningParserManager.registry.unregister("test_old_style")


def test_overriding_an_old_name_of_a_new_style_parser_still_takes_effect(deprecations) -> None:
    class Shouting(DeepSeekR1ReasoningParser):
        def extract_reasoning_content(self, model_output, request):
            reasoning, content = super().extract_reasoning(model_output, request)
            return reasoning, (content or "").upper() or None

    class OldSuper(DeepSeekR1ReasoningParser):  # written against the old names throughout
        def extract_reasoning_content(self, model_output, request):
            reasoning, content = super().extract_reasoning_content(model_output, request)
            return reasoning, (content or "").upper() or None

        def extract_reasoning_content_streaming(self, *args):
            delta = super().extract_reasoning_content_streaming(*args)
            return delta and DeltaMessage(reasoning=delta.reasoning, content=(delta.content or "").upper() or None)

    assert Shouting(None).extract_reasoning("a</think>b", None) == ("a", "B")
    assert OldSuper(None).extract_reasoning("a</think>b", None) == ("a", "B")
    assert stream_reasoning(OldSuper(None), every_char("a</think>bc")) == ("a", "BC")


def test_a_parser_subclassing_the_vllm_base_needs_only_its_tags() -> None:
    class Bracketed(BaseThinkingReasoningParser):
        @property
        def start_token(self) -> str:
            return "[THINK]"

        @property
        def end_token(self) -> str:
            return "[/THINK]"

    parser = Bracketed(None, chat_template_kwargs={})
    assert parser.extract_reasoning("[THINK]r[/THINK]c", None) == ("r", "c")
    assert stream_reasoning(parser, every_char("[THINK]r[/THINK]c")) == ("r", "c")
