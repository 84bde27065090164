"""The step trace's writer (``FORKLESS_STEP_TRACE_DIR``), low in the layers so that every
process's code can record: the engine core, the workers, the grammar process. What the
records hold and how they are summarised: :mod:`forkless.metrics.step_trace`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from forkless import envs

_FLUSH_EVERY = 64


class StepTrace:
    """Buffered JSON-lines records of one process's steps.

    Args:
        path: The file to append to.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows: list[str] = []

    @classmethod
    def open(cls, role: str) -> StepTrace | None:
        """The trace of this process in the role given, or ``None`` when tracing is off."""
        directory = envs.FORKLESS_STEP_TRACE_DIR
        if not directory:
            return None
        Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(Path(directory) / f"steps-{role}-{os.getpid()}.jsonl")

    @staticmethod
    def now() -> float:
        """The trace's clock."""
        return time.monotonic()

    def add(self, **record: Any) -> None:
        """Add one step's record (numbers and strings)."""
        self._rows.append(json.dumps(record))
        if len(self._rows) >= _FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Append the buffered records to the file."""
        if self._rows:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("\n".join(self._rows) + "\n")
            self._rows.clear()

    def close(self) -> None:
        """Flush what is left."""
        self.flush()
