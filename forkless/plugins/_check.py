"""``python -m forkless.plugins._check GROUP NAME``: check one plugin in a fresh process.

The parent (``forkless plugins check``) runs this once per plugin so that nothing it
imported earlier hides what the plugin imports. The child loads the entry point, calls
it twice (for callable groups), compares every registry after each call, and prints one
JSON object on its last stdout line.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

# Modules whose import during registration defeats lazy loading: a plugin should register
# paths and let the worker import the heavy code.
HEAVY_MODULES = ("torch", "transformers", "triton", "tensorflow", "jax", "vllm", "flash_attn")

CALLABLE_GROUPS = {
    "forkless.general_plugins",
    "forkless.platform_plugins",
    "forkless.io_processor_plugins",
    "forkless.endpoint_plugins",
}
CLASS_GROUP_BASES = {
    "forkless.stat_logger_plugins": "forkless.metrics:StatLoggerBase",
    "forkless.logits_processors": "forkless.logits_processors:LogitsProcessor",
}


def _top_level(modules: set[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules})


def check_plugin(group: str, name: str) -> dict[str, Any]:
    """Run the checks on one installed plugin; see the module docstring."""
    from forkless.plugins import import_path, installed_entry_points, snapshot_all
    from forkless.plugins._loader import incompatibility, load_entry_point_value

    entry = next((e for e in installed_entry_points() if e.group == group and e.name == name), None)
    result: dict[str, Any] = {"group": group, "name": name, "ok": False, "problems": []}
    if entry is None:
        result["problems"].append(f"no installed plugin {name!r} in group {group}")
        return result
    result.update(value=entry.value, dist=entry.dist, version=entry.version)
    problems: list[str] = result["problems"]
    reason = incompatibility(entry)
    if reason is not None:
        problems.append(f"incompatible: {reason}; forkless skips it")
        return result
    before = set(sys.modules)
    start = time.perf_counter()
    try:
        obj = load_entry_point_value(entry.value)
        is_callable_group = group in CALLABLE_GROUPS
        if is_callable_group:
            obj()
    except Exception as exc:
        result["load_ms"] = (time.perf_counter() - start) * 1e3
        problems.append(f"loading failed: {type(exc).__name__}: {exc}")
        result["traceback"] = traceback.format_exc()
        return result
    result["load_ms"] = round((time.perf_counter() - start) * 1e3, 3)
    imported = set(sys.modules) - before
    result["imported_modules"] = _top_level(imported)
    heavy = [m for m in result["imported_modules"] if m in HEAVY_MODULES]
    result["heavy_imports"] = heavy
    if heavy and group == "forkless.general_plugins":
        problems.append(
            f"not lazy: registration imported {', '.join(heavy)}; register class paths "
            "('pkg.mod:Class') so heavy modules load only in the process that uses them"
        )
    first = snapshot_all()
    if is_callable_group:
        try:
            obj()
        except Exception as exc:
            problems.append(f"not re-entrant: the second call raised {type(exc).__name__}: {exc}")
            result["traceback"] = traceback.format_exc()
    else:
        base_path = CLASS_GROUP_BASES.get(group)
        again = load_entry_point_value(entry.value)
        if again is not obj:
            problems.append("not re-entrant: loading twice gave two different objects")
        if base_path is not None:
            base = import_path(base_path)
            if not (isinstance(obj, type) and issubclass(obj, base)):
                problems.append(f"{entry.value!r} is not a subclass of {base_path}")
    second = snapshot_all()
    changed = {
        kind: {n: [first.get(kind, {}).get(n), second[kind].get(n)]
               for n in set(first.get(kind, {})) | set(second[kind])
               if first.get(kind, {}).get(n) != second[kind].get(n)}
        for kind in second
    }
    changed = {k: v for k, v in changed.items() if v}
    result["registry_changes_on_second_call"] = changed
    if changed:
        what = "; ".join(f"{kind}: {', '.join(sorted(v))}" for kind, v in changed.items())
        problems.append(
            f"not re-entrant: the second call changed registries ({what}); register the "
            "same path string each time instead of a new object"
        )
    result["registries"] = {k: sorted(v) for k, v in second.items()}
    result["ok"] = not problems
    return result


def main(argv: list[str]) -> int:
    group, name = argv
    try:
        result = check_plugin(group, name)
    except Exception as exc:  # the report must always come back to the parent
        result = {"group": group, "name": name, "ok": False,
                  "problems": [f"checker crashed: {type(exc).__name__}: {exc}"],
                  "traceback": traceback.format_exc()}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
