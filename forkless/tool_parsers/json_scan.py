"""A tolerant scanner for the top-level fields of a (possibly unfinished) JSON object.

Tool parsers stream a call's ``arguments`` as the model writes them, so they need to know,
in a prefix of the output, where each field's value starts and whether it has ended.
``json.loads`` only answers for complete documents; this scanner answers for prefixes too.
Because arguments are taken verbatim from the model's text, every streamed fragment is a
prefix of the final value, which is what makes streamed and whole results agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_WS = " \t\r\n"
_SCALAR = set("-+0123456789.eEtruefalsn")


@dataclass
class ScannedObject:
    """What the scanner found.

    Attributes:
        fields: key -> ``(start, end)`` of its raw value in the text; ``end`` is ``None``
            while the value is unfinished.
        end: Index just past the closing ``}``, or ``None`` when the object is unfinished.
        error: The text cannot be the start of a JSON object.
    """

    fields: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    end: int | None = None
    error: bool = False


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """``text[i]`` is ``"``; the index past the closing quote, or ``None`` if unfinished."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def value_end(text: str, i: int) -> tuple[int | None, bool]:
    """Find the end of the JSON value starting at ``text[i]``.

    Returns:
        ``(end, error)``: ``end`` is ``None`` when the value runs past the text.
    """
    if i >= len(text):
        return None, False
    c = text[i]
    if c == '"':
        return _string_end(text, i), False
    if c in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None, False
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1, False
            i += 1
        return None, False
    if c in _SCALAR:
        j = i
        while j < len(text) and text[j] in _SCALAR:
            j += 1
        # A literal at the very end of the text may still grow ("12" -> "123").
        return (None, False) if j == len(text) else (j, False)
    return None, True


def scan_object(text: str, start: int = 0) -> ScannedObject:
    """Scan the object that starts at ``text[start]`` (after optional whitespace).

    Args:
        text: The text, possibly cut anywhere.
        start: Where to start.

    Returns:
        The fields seen so far and where the object ends.
    """
    out = ScannedObject()
    i = _skip_ws(text, start)
    if i >= len(text):
        return out
    if text[i] != "{":
        out.error = True
        return out
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        out.end = i + 1
        return out
    while i < len(text):
        if text[i] != '"':
            out.error = True
            return out
        key_end = _string_end(text, i)
        if key_end is None:
            return out
        key = json.loads(text[i:key_end])
        i = _skip_ws(text, key_end)
        if i >= len(text):
            return out
        if text[i] != ":":
            out.error = True
            return out
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            return out
        end, error = value_end(text, i)
        if error:
            out.error = True
            return out
        out.fields[key] = (i, end)
        if end is None:
            return out
        i = _skip_ws(text, end)
        if i >= len(text):
            return out
        if text[i] == "}":
            out.end = i + 1
            return out
        if text[i] != ",":
            out.error = True
            return out
        i = _skip_ws(text, i + 1)
    return out
