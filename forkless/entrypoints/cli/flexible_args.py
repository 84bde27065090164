"""The command line's spellings beyond argparse's, as vLLM's accepts them.

* ``--max_model_len 64`` is ``--max-model-len 64``: underscores in a flag's name (the part
  before any ``.`` or ``=``) read as dashes. Values are never touched.
* ``--speculative-config.method ngram --speculative-config.num_speculative_tokens 3``
  builds the JSON object ``{"method": "ngram", "num_speculative_tokens": 3}`` of the JSON
  flag before the dot, a key per dot (``--a.b.c 1`` is ``{"b": {"c": 1}}``). Each value
  is read as JSON where it is JSON (``3``, ``true``, ``[1, 2]``), else as text;
  ``--flag.key+ a,b`` gives the list ``["a", "b"]``. The same flag also given as JSON
  text is the base the dotted keys are written over.

Invariants:
    * Only arguments before a bare ``--`` are rewritten; everything after it is as given.
    * A dotted key on a flag that takes no JSON object, or without a value, is an error
      naming it, never dropped; a key given twice is an error, not a silent overwrite.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """``parser``'s actions and those of its sub-commands (``bench throughput``'s)."""
    found = []
    for action in parser._actions:  # argparse has no public accessor
        found.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_actions(sub))
    return found


def _set(tree: dict[str, Any], keys: list[str], value: Any, shown: str) -> None:
    for key in keys[:-1]:
        node = tree.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"{shown}: {key!r} already holds {node!r}, not an object")
        tree = node
    if keys[-1] in tree:
        raise ValueError(f"{shown} is given twice")
    tree[keys[-1]] = value


def _value(text: str, as_list: bool) -> Any:
    if as_list:
        return text.split(",")
    try:
        return json.loads(text)
    except ValueError:
        return text


def normalize_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` with vLLM's flag spellings rewritten to the ones ``parser`` knows.

    Args:
        argv: The sub-command's arguments (the sub-command's name included or not).
        parser: The sub-command's parser, whose ``metavar="JSON"`` flags take dotted keys.

    Raises:
        ValueError: A dotted key on a flag that takes no JSON, a dotted key without a
            value, a key given twice, or JSON text for the flag that is not an object.
    """
    actions = _actions(parser)
    json_flags = {opt for a in actions if a.metavar == "JSON" for opt in a.option_strings}
    flags = {opt for a in actions for opt in a.option_strings}
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i:])
            break
        i += 1
        if not arg.startswith("--"):
            out.append(arg)
            continue
        key, eq, value = arg.partition("=")
        name, dot, path = key.partition(".")
        name = name.replace("_", "-")
        if not dot:
            out.append(name + eq + value)
            continue
        shown = f"{name}.{path}"
        if name not in json_flags:
            raise ValueError(f"{shown}: {name} takes no JSON object, so it has no keys to set"
                             if name in flags
                             else f"{shown}: unknown flag {name}")
        if not eq:
            if i >= len(argv) or argv[i] == "--":
                raise ValueError(f"{shown} needs a value")
            value = argv[i]
            i += 1
        as_list = path.endswith("+")
        keys = path.removesuffix("+").split(".")
        if not all(keys):
            raise ValueError(f"{shown}: empty key")
        _set(dotted.setdefault(name, {}), keys, _value(value, as_list), shown)
    for name, tree in dotted.items():
        out = _merged(out, name, tree)
    return out


def _merged(argv: list[str], flag: str, tree: dict[str, Any]) -> list[str]:
    """``argv`` with ``flag``'s JSON object updated by ``tree``, or with ``flag`` added
    (before any bare ``--``) where it is not given."""
    stop = argv.index("--") if "--" in argv else len(argv)
    for i in reversed(range(stop)):  # argparse keeps a flag's last value: update that one
        arg = argv[i]
        if arg == flag and i + 1 < stop:
            base, end = argv[i + 1], i + 2
        elif arg.startswith(flag + "="):
            base, end = arg.split("=", 1)[1], i + 1
        else:
            continue
        try:
            loaded = json.loads(base)
        except ValueError:
            raise ValueError(f"{flag}: not valid JSON: {base!r:.80}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{flag}: expected a JSON object, got {base!r:.80}")
        _update(loaded, tree)
        return [*argv[:i], flag, json.dumps(loaded), *argv[end:]]
    return [*argv[:stop], flag, json.dumps(tree), *argv[stop:]]


def _update(base: dict[str, Any], tree: dict[str, Any]) -> None:
    for key, value in tree.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _update(base[key], value)
        else:
            base[key] = value


__all__ = ["normalize_argv"]
