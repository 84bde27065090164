"""Run by test_multiprocess.py: an "API server", an "engine core" and a "worker" process,
started with spawn, each loading the general plugins itself (twice)."""

from __future__ import annotations

import json
import multiprocessing as mp
import sys


def role_main(role: str, queue: "mp.Queue[dict]") -> None:
    from forkless.plugins import load_general_plugins, snapshot_all

    load_general_plugins()
    load_general_plugins()
    from forkless import ModelRegistry

    report: dict = {"role": role, "registries": snapshot_all()}
    if role == "worker":
        try:
            cls, arch = ModelRegistry.resolve_model_cls(["ToyLlamaForCausalLM"])
            report["resolved"] = f"{cls.__module__}:{cls.__qualname__}"
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"
    report["model_module_imported"] = "forkless_example_model.model" in sys.modules
    report["torch_imported"] = "torch" in sys.modules
    queue.put(report)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=role_main, args=(role, queue), name=f"forkless-{role}")
             for role in ("api-server", "engine-core", "worker")]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    print(json.dumps({r["role"]: r for r in reports}))
