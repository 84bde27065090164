"""Reading ``tool_choice="required"``'s JSON array of calls while it is written.

The constrained output is ``[{"name": ..., "parameters": {...}}, ...]``. A stream sends
each call's name as soon as it is complete and its arguments as the text of its
``parameters`` value grows, exactly as the model wrote it; the whole output's calls take
the same text, so a streamed call adds up to the unstreamed one.

The scanner walks each character once, whatever the number of steps: a stream feeds it
the cumulative text, and it carries on from where the previous step stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WHITESPACE = " \t\r\n"


@dataclass
class ScannedCall:
    """One element of the array, as far as it is written.

    Attributes:
        name: The ``name`` member once its string is complete, else ``None``.
        arguments_start: Where the ``parameters`` value starts in the text (``None``:
            not yet).
        arguments_end: Where it ends (exclusive), once it is complete.
    """

    name: str | None = None
    arguments_start: int | None = None
    arguments_end: int | None = None

    def arguments(self, text: str) -> str:
        """The ``parameters`` value's text so far (``""`` before it starts)."""
        if self.arguments_start is None:
            return ""
        return text[self.arguments_start:self.arguments_end]


class ToolCallArrayScanner:
    """Finds the calls of a JSON array of ``{"name", "parameters"}`` objects in a text
    that grows at its end.

    Only what the array's shape needs is tracked: the open brackets, strings (so that
    brackets inside them do not count), and at the depth of a call object, its member
    keys and where the ``name`` and ``parameters`` values are. Text that is not such an
    array yields no calls; it is not validated (the whole output is, with ``json``).
    """

    def __init__(self) -> None:
        self.calls: list[ScannedCall] = []
        self._pos = 0
        self._open: list[str] = []  # the brackets open at the scan's position, outermost first
        self._in_string = False
        self._escape = False
        self._string_start = 0
        self._expect_key = False  # in a call object, before a member's key
        self._key: str | None = None  # the member whose value comes next or is being read
        self._value_started = False
        self._scalar = False  # the parameters value is a number, true, false or null

    def feed(self, text: str) -> list[ScannedCall]:
        """Scan ``text`` (the previous text, extended) and return the calls found so far."""
        for i in range(self._pos, len(text)):
            self._char(text, i, text[i])
        self._pos = len(text)
        return self.calls

    def _char(self, text: str, i: int, c: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                if self._in_call():
                    self._string_closed(text, i)
            return
        if self._scalar:
            if c not in _WHITESPACE and c not in ",}":
                return
            self._scalar = False
            self.calls[-1].arguments_end = i
            self._key = None
        if self._in_call() and self._key is not None and not self._value_started \
                and c not in _WHITESPACE and c != ":":
            self._value_started = True
            if self._key == "parameters":
                self.calls[-1].arguments_start = i
                self._scalar = c not in '{["'
                if self._scalar:
                    return
        if c == '"':
            self._in_string, self._string_start = True, i
        elif c in "{[":
            self._open.append(c)
            if self._in_call():
                self.calls.append(ScannedCall())
                self._expect_key, self._key = True, None
        elif c in "}]":
            if self._open:
                self._open.pop()
            if self._in_call() and self._key == "parameters":
                self.calls[-1].arguments_end = i + 1
                self._key = None
        elif c == "," and self._in_call():
            self._expect_key, self._key = True, None

    def _in_call(self) -> bool:
        """Whether the scan is at the level of a call object's members."""
        return self._open == ["[", "{"]

    def _string_closed(self, text: str, i: int) -> None:
        raw = text[self._string_start:i + 1]
        if self._expect_key:
            self._expect_key, self._key, self._value_started = False, _decoded(raw), False
            return
        call = self.calls[-1]
        if self._key == "name":
            call.name = _decoded(raw)
        elif self._key == "parameters":
            call.arguments_end = i + 1
        self._key = None


def _decoded(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None
