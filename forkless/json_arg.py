"""Flags whose value is a JSON object (``--speculative-config``, ``--pooler-config``,
``--structured-outputs-config``): given as text on the command line or as a dict from
Python, read the same way, with the same errors.

Invariants:
    * The result is a dict, or a ``ValueError`` naming the flag and what was wrong: text
      that is not JSON, or JSON that is not an object. Keys are the caller's to check,
      or :func:`json_config_arg`'s: a config dataclass's fields.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any


def json_object_arg(value: str | dict[str, Any], flag: str) -> dict[str, Any]:
    """``value`` (JSON text or a dict) as a dict.

    Args:
        value: The flag's value.
        flag: Its name, for the messages (``--speculative-config``).

    Raises:
        ValueError: Not valid JSON, or not a JSON object.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{flag}: not valid JSON ({exc}): {value!r:.80}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: expected a JSON object, got {value!r:.80}")
    return value


def json_config_arg(value: str | dict[str, Any], flag: str, cls: type) -> dict[str, Any]:
    """``value`` as a dict whose keys are all fields of the dataclass ``cls`` (a config
    flag's keys); the values are the caller's to check.

    Raises:
        ValueError: Not valid JSON, not a JSON object, or a key ``cls`` lacks (the message
            lists the known ones).
    """
    value = json_object_arg(value, flag)
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{flag}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return value


__all__ = ["json_config_arg", "json_object_arg"]
