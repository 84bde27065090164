"""argparse types the commands share: each refuses a bad value with argparse's one line,
naming the flag and what it expects, before anything slow starts."""

from __future__ import annotations

import argparse


def port_number(value: str) -> int:
    """``--port``: 0 (any free port) to 65535."""
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in 0-65535, got {value!r}")
    return port


def positive_int(value: str) -> int:
    """A count that must be at least 1 (``--num-prompts``, ``--output-len``...)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number
