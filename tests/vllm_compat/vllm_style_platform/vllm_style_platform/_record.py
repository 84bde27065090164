"""Test instrumentation, not part of the port: each hook that runs appends one JSON line
(``hook``, ``pid`` and details) to the file ``VLLM_STYLE_PLATFORM_RECORD`` names."""

import json
import os


def record(hook: str, **details) -> None:
    path = os.environ.get("VLLM_STYLE_PLATFORM_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"hook": hook, "pid": os.getpid(), **details}) + "\n")
