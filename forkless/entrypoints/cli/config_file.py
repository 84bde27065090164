"""``--config FILE``: a sub-command's flags from a YAML file (vLLM's form).

Invariants:
    * The file is a YAML mapping of flag names (``max-model-len`` or ``max_model_len``) to
      values; each is parsed as the flag it names and becomes that flag's default, so the
      same flag given on the command line wins, and MODEL given there wins over the
      file's ``model``.
    * ``true`` gives a switch, ``false`` gives its ``--no-`` form where the flag has one
      (and nothing where false is the default); a list gives the flag followed by its
      items, or its JSON where the flag takes one value (``allowed-origins: [...]``); a
      mapping gives its JSON (``speculative-config: {...}``).
    * A key that names no flag of the sub-command is an error naming the key and the file,
      as an unknown flag on the command line is; nothing in the file is ignored.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CONFIG_FLAG = "--config"


def _config_path(argv: list[str]) -> tuple[int, int, str] | None:
    """Where ``--config FILE`` (or ``--config=FILE``) is in ``argv``: (start, end, path).

    Raises:
        ValueError: ``--config`` without a file, or given more than once.
    """
    found = []
    for i, arg in enumerate(argv):
        if arg == CONFIG_FLAG:
            if i + 1 >= len(argv):
                raise ValueError(f"{CONFIG_FLAG} needs a YAML file")
            found.append((i, i + 2, argv[i + 1]))
        elif arg.startswith(CONFIG_FLAG + "="):
            found.append((i, i + 1, arg.split("=", 1)[1]))
        elif arg == "--":
            break
    if len(found) > 1:
        raise ValueError(f"{CONFIG_FLAG} is given {len(found)} times: give one file")
    return found[0] if found else None


def _flag_args(key: str, value: Any, options: dict[str, argparse.Action], path: str) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if flag not in options or flag == CONFIG_FLAG:
        raise ValueError(f"{path}: {key!r} is not a flag of this command (see --help)")
    if options[flag].nargs == 0:  # a switch: only true or false mean anything
        if not isinstance(value, bool):
            raise ValueError(f"{path}: {key!r} is a switch: expected true or false, got {value!r}")
        if value:
            return [flag]
        negative = "--no-" + key.replace("_", "-")
        return [negative] if negative in options else []
    if isinstance(value, bool):
        raise ValueError(f"{path}: {key!r} takes a value, not {str(value).lower()}")
    if value is None:
        raise ValueError(f"{path}: {key!r} has no value")
    if isinstance(value, list):
        if options[flag].nargs in ("+", "*"):
            return [flag, *(json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value)]
        return [flag, json.dumps(value)]  # a flag that takes one JSON list (--allowed-origins)
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def expand_config_file(argv: list[str], subparser: argparse.ArgumentParser) -> list[str]:
    """Make the flags in ``--config FILE`` the sub-command's defaults; ``argv`` without it.

    Args:
        argv: The command line after ``forkless``, the sub-command first.
        subparser: The sub-command's parser (its flags are what the file may name); the
            file's values become its defaults, so the command line's own flags win.

    Returns:
        The command line to parse.

    Raises:
        ValueError: The file cannot be read, is not a YAML mapping, names a key that is
            not one of the sub-command's flags, or gives a value the flag refuses.
    """
    import yaml

    found = _config_path(argv)
    if found is None:
        return argv
    start, end, path = found
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{CONFIG_FLAG} {path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{CONFIG_FLAG} {path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{CONFIG_FLAG} {path}: expected a mapping of flag names to values, "
                         f"got a {type(data).__name__}")
    rest = argv[:start] + argv[end:]
    options = subparser._option_string_actions  # argparse has no public way to list them
    flags: list[str] = []
    dests: set[str] = set()
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{CONFIG_FLAG} {path}: keys must be flag names, got {key!r}")
        if key == "model" and _gives_positional(rest[1:], options):
            continue  # the command line's MODEL wins over the file's
        args = _flag_args(key, value, options, path)
        if args:
            flags += args
            dests.add(options[args[0]].dest)
    # Parsed alone, then made defaults: a flag on the command line then wins whatever its
    # position, and a list flag from the file cannot swallow the command line's MODEL.
    subparser.exit_on_error = False
    try:
        parsed, unknown = subparser.parse_known_args(flags, argparse.Namespace())
    except argparse.ArgumentError as exc:
        raise ValueError(f"{CONFIG_FLAG} {path}: {exc}") from None
    finally:
        subparser.exit_on_error = True
    if unknown:
        raise ValueError(f"{CONFIG_FLAG} {path}: values that no flag takes: {unknown}")
    subparser.set_defaults(**{dest: getattr(parsed, dest) for dest in dests})
    return rest


def _gives_positional(tail: list[str], options: dict[str, argparse.Action]) -> bool:
    """Whether ``tail`` gives a positional argument (MODEL), not only flags and their values."""
    i = 0
    while i < len(tail):
        arg = tail[i]
        if not arg.startswith("-"):
            return True
        action = options.get(arg.split("=", 1)[0])
        takes = action is not None and "=" not in arg and action.nargs != 0
        if takes:
            i += 1
            if action.nargs in ("+", "*"):
                while i < len(tail) and not tail[i].startswith("-"):
                    i += 1
                continue
        i += 1
    return False
