"""Feed a parser an output in pieces, as the server does, and collect what it streams."""

from __future__ import annotations

from typing import Any, Iterator


def every_char(text: str) -> list[str]:
    return list(text)


def two_way_splits(text: str) -> Iterator[list[str]]:
    """``[text[:i], text[i:]]`` for every boundary ``i``."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


def stream_tools(parser: Any, chunks: list[str], request: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """Concatenated content and, per index, ``{"id", "name", "arguments"}`` of the deltas."""
    prev, content, calls = "", "", {}
    for chunk in chunks:
        cur = prev + chunk
        delta = parser.extract_tool_calls_streaming(prev, cur, chunk, [], [], [], request)
        prev = cur
        if delta is None:
            continue
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.index not in calls:
                assert call.id and call.id.startswith("chatcmpl-tool-") and call.function.name, call
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
            else:
                assert call.id is None and call.function.name is None, "id and name come once"
            calls[call.index]["arguments"] += call.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    return content or None, [calls[i] for i in sorted(calls)]


def stream_reasoning(parser: Any, chunks: list[str]) -> tuple[str | None, str | None]:
    """Concatenated ``reasoning`` and ``content`` of the deltas (``None`` when empty)."""
    prev, reasoning, content = "", "", ""
    for chunk in chunks:
        cur = prev + chunk
        delta = parser.extract_reasoning_streaming(prev, cur, chunk, [], [], [])
        prev = cur
        if delta is not None:
            reasoning += delta.reasoning or ""
            content += delta.content or ""
    return reasoning or None, content or None


def token_chunks(tokenizer: Any, text: str) -> list[str]:
    """``text`` cut where the server's detokenizer would cut it: after each token whose
    decoded text is complete (a partial UTF-8 character waits for the next token)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    chunks, sent = [], ""
    for i in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:i])
        if decoded.endswith("\ufffd"):
            continue
        chunks.append(decoded[len(sent):])
        sent = decoded
    assert "".join(chunks) == text
    return chunks
