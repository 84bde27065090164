"""Refusing to build an engine inside a spawned process's import of the main module.

forkless starts its worker and engine-core processes with ``spawn``, which imports the
parent's main module again in each child. A script that builds ``LLM(...)`` at module
level, without ``if __name__ == "__main__":``, builds one in every child too; Python then
refuses the grandchild's start with a ``RuntimeError``, but the half-built engine in the
child (its sockets, its threads) kept that child alive, so the parent waited for its
worker forever. Checking first, before anything is built, makes the child exit at once
with a message that says what to change, and the parent report that its worker died.
"""

from __future__ import annotations

import multiprocessing.process


def check_not_bootstrapping(what: str) -> None:
    """Raise if this process is a spawned child still importing its parent's main module.

    Args:
        what: What was being built (``"LLM()"``), for the message.

    Raises:
        RuntimeError: Saying to guard the script's main code.
    """
    # What multiprocessing itself checks before starting a process (``_inheriting`` is set
    # while a spawned child prepares, i.e. re-imports the main module).
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"{what} was called while a forkless child process was importing your main module: forkless "
            "starts its processes with 'spawn', which runs the main module again in each of them. Put the "
            "code that builds it under `if __name__ == \"__main__\":`")
