"""Registers ``ToyLlamaForCausalLM`` with forkless — by path, so nothing heavy is imported.

This function runs in every forkless process (API server, engine core, workers). It
follows the two rules of safe registration: it is re-entrant (registering the same path
twice is a no-op) and it stores a path, not a class object (the model module, which
imports torch, is imported only by the worker that builds the model).
"""

import os


def register() -> None:
    from forkless import ModelRegistry

    ModelRegistry.register_model("ToyLlamaForCausalLM", "forkless_example_model.model:ToyLlamaForCausalLM")
    _record("registered")


def _record(event: str) -> None:
    """Tests set FORKLESS_EXAMPLE_RECORD_DIR to see which processes loaded the plugin."""
    record_dir = os.environ.get("FORKLESS_EXAMPLE_RECORD_DIR")
    if not record_dir:
        return
    import json
    import multiprocessing

    line = {"event": event, "pid": os.getpid(), "process": multiprocessing.current_process().name}
    with open(os.path.join(record_dir, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
