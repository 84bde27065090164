"""``llama3_json``: Llama 3.x JSON calls, ``{"name": ..., "parameters": {...}}``.

The output may start with ``<|python_tag|>``; several calls are separated by ``;``. An
output that does not start with a call is plain content; text after the calls is content.
"""

from __future__ import annotations

from forkless.tool_parsers.json_scan import scan_object
from forkless.tool_parsers.scanning import ScanningToolParser, ScanResult, call_from_object

BOT = "<|python_tag|>"
_WS = " \t\r\n"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


class Llama3JsonToolParser(ScanningToolParser):
    """The ``llama3_json`` tool parser."""

    def scan(self, text: str, final: bool) -> ScanResult:
        i = _skip_ws(text, 0)
        if text.startswith(BOT, i):
            i = _skip_ws(text, i + len(BOT))
        elif not final and BOT.startswith(text[i:]):
            return ScanResult()  # still undecided: "<|pyth" or only whitespace
        if i >= len(text):
            return ScanResult() if not final or text.startswith(BOT, _skip_ws(text, 0)) else ScanResult(content=text)
        if text[i] != "{":
            return ScanResult(content=text)
        result = ScanResult()
        while True:
            obj = scan_object(text, i)
            if obj.error:
                result.valid = False
                return result
            result.calls.append(call_from_object(text, obj, ("parameters", "arguments")))
            if obj.end is None:
                result.valid = not final
                return result
            i = _skip_ws(text, obj.end)
            if i < len(text) and text[i] == ";":
                i = _skip_ws(text, i + 1)
            if i >= len(text):
                return result
            if text[i] != "{":
                # Words after the calls are the model talking: keep them as content.
                result.content = text[obj.end:]
                return result
