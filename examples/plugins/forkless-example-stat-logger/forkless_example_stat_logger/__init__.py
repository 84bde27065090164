"""A stat logger plugin: a ``StatLoggerBase`` subclass, constructed in the API server.

It appends one JSON line per batch of engine outputs to the file named by
``FORKLESS_EXAMPLE_STATS_FILE`` (and does nothing when that is unset), so that a test, or
a curious user, can see exactly what forkless hands to stat loggers.
"""

import json
import os

from forkless.metrics import StatLoggerBase


class JsonLinesStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0) -> None:
        super().__init__(vllm_config, engine_index)
        self.path = os.environ.get("FORKLESS_EXAMPLE_STATS_FILE")

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if iteration_stats is None:
            return
        self._write({
            "event": "record",
            "prompt_tokens": iteration_stats.num_prompt_tokens,
            "generation_tokens": iteration_stats.num_generation_tokens,
            "finished": [f.finish_reason for f in iteration_stats.finished_requests],
            "running": scheduler_stats.num_running if scheduler_stats is not None else None,
        })

    def log_engine_initialized(self) -> None:
        self._write({"event": "engine_initialized", "engine": self.engine_index})

    def _write(self, line: dict) -> None:
        if not self.path:
            return
        # Append and close each time: the file stays complete if the server is killed.
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
