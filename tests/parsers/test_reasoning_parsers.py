"""The built-in reasoning parsers on recorded outputs, whole and streamed in every split."""

from __future__ import annotations

import pytest

from forkless.reasoning import ReasoningParser, ReasoningParserManager
from tests.parsers.recorded import DEEPSEEK_R1, QWEN3
from tests.parsers.streaming import every_char, stream_reasoning, token_chunks, two_way_splits

CASES = [("qwen3", *c) for c in QWEN3] + [("deepseek_r1", *c) for c in DEEPSEEK_R1]
IDS = [f"{n}-{i}" for n, cs in (("qwen3", QWEN3), ("deepseek_r1", DEEPSEEK_R1)) for i in range(len(cs))]
# A text cut inside "</think>" is held back while streaming; the server's end-of-stream
# top-up settles it (tested with ChoiceParser), so it is left out of the bare-parser tests.
STREAM_CASES = [(n, o, r, c) for n, o, r, c in CASES if not o.endswith("</thi")]


def make(name: str, tokenizer=None) -> ReasoningParser:
    return ReasoningParserManager.get_reasoning_parser(name)(tokenizer)


@pytest.mark.parametrize("name, output, reasoning, content", CASES, ids=IDS)
def test_whole_output(name, output, reasoning, content) -> None:
    assert make(name).extract_reasoning_content(output, None) == (reasoning, content)


@pytest.mark.parametrize("name, output, reasoning, content", STREAM_CASES)
def test_streamed_one_character_at_a_time_equals_whole(name, output, reasoning, content) -> None:
    assert stream_reasoning(make(name), every_char(output)) == (reasoning, content)


@pytest.mark.parametrize("name, output, reasoning, content", STREAM_CASES)
def test_streamed_in_two_pieces_at_every_boundary_equals_whole(name, output, reasoning, content) -> None:
    for chunks in two_way_splits(output):
        assert stream_reasoning(make(name), chunks) == (reasoning, content), chunks


@pytest.mark.parametrize("name, output, reasoning, content", STREAM_CASES)
def test_streamed_token_by_token_equals_whole(name, output, reasoning, content, tokenizer) -> None:
    assert stream_reasoning(make(name, tokenizer), token_chunks(tokenizer, output)) == (reasoning, content)


def test_is_reasoning_end_with_a_multi_token_end_tag(tokenizer) -> None:
    parser = make("deepseek_r1", tokenizer)
    assert len(tokenizer.encode("</think>", add_special_tokens=False)) > 1  # SmolLM2 splits it
    assert parser.is_reasoning_end(tokenizer.encode("so 4.</think>The", add_special_tokens=False))
    assert not parser.is_reasoning_end(tokenizer.encode("still thinking", add_special_tokens=False))
