"""Logging set-up shared by every forkless process.

Each process (API server, engine core, workers) configures the ``forkless`` logger once,
with the process name in every line so that interleaved output stays readable.
"""

from __future__ import annotations

import logging
import sys

from forkless import envs

_FORMAT = "%(levelname)s %(asctime)s [%(processName)s pid=%(process)d] %(name)s: %(message)s"
_configured = False


def configure_logging() -> None:
    """Attach one stderr handler to the ``forkless`` logger (idempotent).

    ``FORKLESS_LOGGING_LEVEL`` sets the level (default INFO); ``FORKLESS_CONFIGURE_LOGGING=0``
    leaves logging entirely to the application embedding forkless.
    """
    global _configured
    if _configured or not envs.FORKLESS_CONFIGURE_LOGGING:
        return
    _configured = True
    root = logging.getLogger("forkless")
    level = envs.FORKLESS_LOGGING_LEVEL
    root.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    root.addHandler(handler)
    root.propagate = False


def init_logger(name: str) -> logging.Logger:
    """A logger under ``forkless`` with the shared handler configured."""
    configure_logging()
    return logging.getLogger(name)
