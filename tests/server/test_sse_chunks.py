"""The directly written text chunks of a completions stream are the pydantic model's JSON."""

from __future__ import annotations

import json

import pytest

from forkless.entrypoints.openai.serving import _sse, _TextChunks
from forkless.protocol.openai import CompletionChoice, CompletionStreamResponse

TEXTS = ["", "plain", ' "quoted" \\ back\\slash', "line\nbreak\ttab\r\x00\x1f\x7f", "caf\u00e9 \u65e5\u672c \U0001f600",
         "\u2028\u2029 separators", "</script>"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("index", [0, 7, 123])
def test_text_chunk_is_the_models_json(text: str, index: int) -> None:
    request_id, created, model = 'cmpl-"odd"\u00e9', 1_700_000_000, "my/model \u00e9"
    fast = _TextChunks(request_id, created, model)(index, text)
    slow = _sse(CompletionStreamResponse(id=request_id, created=created, model=model, choices=[
        CompletionChoice(index=index, text=text)]))
    assert fast.startswith("data: ") and fast.endswith("\n\n")
    assert json.loads(fast[len("data: "):]) == json.loads(slow[len("data: "):])
    assert list(json.loads(fast[6:])) == list(json.loads(slow[6:]))  # same field order
