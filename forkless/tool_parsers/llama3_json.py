"""``llama3_json``: Llama 3.x JSON calls, ``{"name": ..., "parameters": {...}}``.

As vLLM's ``llama3_json`` parser: the output may start with ``<|python_tag|>``; calls may
follow some leading text; several calls may be separated by ``;``. Every JSON object in
the output must be a call — a ``name`` and its ``arguments`` or ``parameters`` (a
``{"name": ...}`` without either is not a call) — or the whole output is plain content;
so is an output with a ``{`` that does not start a JSON object.

Unlike vLLM, text before and after the calls stays content (vLLM drops it when it finds
calls): a stream cannot take back text it has already sent as content, and forkless's
whole and streamed results are the same.
"""

from __future__ import annotations

from forkless.tool_parsers.json_scan import scan_object
from forkless.tool_parsers.scanning import ScanningToolParser, ScanResult, call_from_object

BOT = "<|python_tag|>"
_WS = " \t\r\n"
ARG_KEYS = ("arguments", "parameters")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


class Llama3JsonToolParser(ScanningToolParser):
    """The ``llama3_json`` tool parser."""

    def scan(self, text: str, final: bool) -> ScanResult:
        i = _skip_ws(text, 0)
        if text.startswith(BOT, i):
            pos = i + len(BOT)  # the tag is not content
        elif not final and BOT.startswith(text[i:]):
            return ScanResult()  # undecided: "<|pyth", or only whitespace so far
        else:
            pos = 0
        result = ScanResult()
        first = True
        while True:
            k = text.find("{", pos)
            segment = text[pos:] if k < 0 else text[pos:k]
            # Text before the first call is content unless it is only whitespace; between
            # and after calls, whitespace and one ";" are separators.
            if segment.strip(_WS) not in (("",) if first else ("", ";")):
                result.content += segment
            if k < 0:
                return result
            obj = scan_object(text, k)
            call = call_from_object(text, obj, ARG_KEYS, require_args=True)
            if obj.error or (obj.end is not None and call.name is None):
                # Not JSON, or JSON that is not a call: the whole output is text.
                result.valid = False
                result.content = text if not result.calls else result.content + text[k:]
                return result
            result.calls.append(call)
            if obj.end is None:
                result.valid = not final
                return result
            pos, first = obj.end, False
