"""``python -m forkless.plugins._check GROUP NAME``: check one plugin in a fresh process.

Invariants:
    * One plugin per process: the parent (``forkless plugins check``) runs this once per
      plugin, so nothing imported for another plugin hides what this one imports.
    * What the group's values are (callable or class, which interface) comes from
      :data:`forkless.plugins.GROUPS`, never from a table of its own.
    * The laziness report ("imported during registration") is measured right after the
      first call, before anything else is imported: the class paths the plugin registered
      are imported (to check they exist and subclass their registry's interface) only
      after it.
    * The report is one JSON object on the last stdout line, whatever happens.

The child loads the entry point, calls it twice (for callable groups), compares every
registry after each call, then imports what the second call registered.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

from forkless.plugins._discovery import EntryPointInfo
from forkless.plugins._loader import ENDPOINT_PLUGINS_GROUP, GROUPS, GroupSpec, ValueKind

# Modules whose import during registration defeats lazy loading: a plugin should register
# paths and let the worker import the heavy code.
HEAVY_MODULES = ("torch", "transformers", "triton", "tensorflow", "jax", "vllm", "flash_attn")


def _top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def new_top_level_modules(before: set[str], after: set[str]) -> list[str]:
    """The top-level packages first imported between two ``sys.modules`` snapshots.

    A package already imported before (``forkless`` itself, the standard library the
    checker uses) is left out, even when new submodules of it were imported.
    """
    return sorted(_top_level(after - before) - _top_level(before))


def _find_entry(group: str, name: str) -> EntryPointInfo | None:
    from forkless.plugins._loader import installed_entry_points

    return next((e for e in installed_entry_points() if e.group == group and e.name == name), None)


def check_plugin(group: str, name: str) -> dict[str, Any]:
    """Run the checks on one installed plugin; see the module docstring."""
    from forkless.plugins._loader import incompatibility

    result: dict[str, Any] = {"group": group, "name": name, "ok": False, "problems": []}
    entry = _find_entry(group, name)
    spec = GROUPS.get(group)
    if entry is None or spec is None:
        result["problems"].append(f"no installed plugin {name!r} in group {group}")
        return result
    result.update(value=entry.value, dist=entry.dist, version=entry.version)
    reason = incompatibility(entry)
    if reason is not None:
        result["problems"].append(f"incompatible: {reason}; forkless skips it")
        return result
    loaded = _first_use(entry, spec, result)
    if loaded is None:
        return result
    obj, returned = loaded
    if spec.detector:
        result["inactive"] = returned is None
    registered = _second_use(entry, spec, obj, result)
    if spec.returns is not None and returned is not None:
        result["problems"].extend(_returned_class_problems(returned, spec.returns))
    if group == ENDPOINT_PLUGINS_GROUP:
        result["problems"].extend(_endpoint_problems(returned))
    if registered is not None:
        result["problems"].extend(_check_registered(registered, result))
        result["problems"].extend(_check_lora_resolvers(result))
    result["ok"] = not result["problems"]
    return result


def _first_use(entry: EntryPointInfo, spec: GroupSpec,
               result: dict[str, Any]) -> tuple[Any, Any] | None:
    """Load (and call) the plugin, measuring time and imports; ``None`` when it failed.

    Returns:
        ``(the loaded object, what calling it returned)``.
    """
    from forkless.plugins._loader import load_entry_point_value

    before = set(sys.modules)
    start = time.perf_counter()
    returned = None
    try:
        obj = load_entry_point_value(entry.value)
        if spec.kind is ValueKind.CALLABLE:
            returned = obj()
    except Exception as exc:
        result["load_ms"] = round((time.perf_counter() - start) * 1e3, 3)
        result["problems"].append(f"loading failed: {type(exc).__name__}: {exc}")
        result["traceback"] = traceback.format_exc()
        return None
    result["load_ms"] = round((time.perf_counter() - start) * 1e3, 3)
    result["imported_modules"] = new_top_level_modules(before, set(sys.modules))
    heavy = [m for m in result["imported_modules"] if m in HEAVY_MODULES]
    result["heavy_imports"] = heavy
    if heavy and entry.group == "forkless.general_plugins":
        result["problems"].append(
            f"not lazy: registration imported {', '.join(heavy)}; register class paths "
            "('pkg.mod:Class') so heavy modules load only in the process that uses them"
        )
    return obj, returned


def _second_use(entry: EntryPointInfo, spec: GroupSpec, obj: Any,
                result: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Use the plugin again and report what changed.

    Returns:
        ``(registry kind, name)`` of every registration the second call made, or ``None``
        when there was no successful second call.
    """
    from forkless.plugins._registry import recording_registrations, snapshot_all

    problems: list[str] = result["problems"]
    registered: list[tuple[str, str]] | None = None
    first = snapshot_all()
    if spec.kind is ValueKind.CALLABLE:
        with recording_registrations() as recorded:
            try:
                obj()
            except Exception as exc:
                problems.append(f"not re-entrant: the second call raised {type(exc).__name__}: {exc}")
                result["traceback"] = traceback.format_exc()
            else:
                registered = recorded
    else:
        problems.extend(_class_value_problems(entry, spec, obj))
    second = snapshot_all()
    changed = _registry_changes(first, second)
    result["registry_changes_on_second_call"] = changed
    if changed:
        what = "; ".join(f"{kind}: {', '.join(sorted(v))}" for kind, v in changed.items())
        problems.append(
            f"not re-entrant: the second call changed registries ({what}); register the "
            "same path string each time instead of a new object"
        )
    result["registries"] = {k: sorted(v) for k, v in second.items()}
    return registered


def _class_value_problems(entry: EntryPointInfo, spec: GroupSpec, obj: Any) -> list[str]:
    """A class-valued entry point (a logits processor, a stat logger): it must load the same
    class twice, subclass the group's interface and implement its abstract methods, since
    the process that uses it builds an instance (a worker only after the model loaded)."""
    from forkless.plugins._loader import load_entry_point_value
    from forkless.plugins._registry import check_implements, import_path

    problems = []
    if load_entry_point_value(entry.value) is not obj:
        problems.append("not re-entrant: loading twice gave two different objects")
    if spec.interface is not None:
        base = import_path(spec.interface)
        if not (isinstance(obj, type) and issubclass(obj, base)):
            problems.append(f"{entry.value!r} is not a subclass of {spec.interface}")
        else:
            try:
                check_implements(obj, repr(entry.value))
            except TypeError as exc:
                problems.append(str(exc))
    return problems


def _returned_class_problems(returned: Any, interface: str) -> list[str]:
    """A detector's returned class path: it must import, subclass ``interface`` and
    implement its abstract methods (as the process that uses it will check)."""
    from forkless.plugins._registry import PluginImportError, check_implements, import_path

    if not isinstance(returned, str):
        return [f"returned {returned!r}: expected a class path string ('pkg.mod:Class') or None"]
    try:
        cls = import_path(returned)
    except PluginImportError as exc:
        return [f"returned {returned!r}, which is broken: {exc}"]
    base = import_path(interface)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        return [f"returned {returned!r}, which is not a subclass of {interface}"]
    try:
        check_implements(cls, f"returned {returned!r}")
    except TypeError as exc:
        return [str(exc)]
    return []


def _endpoint_problems(returned: Any) -> list[str]:
    """An endpoint factory's object must attach its routes: the API server skips one without
    ``attach_router`` (a warning only) and fails to start on one whose ``attach_router``
    raises, so attach them to a throwaway FastAPI app as the server would."""
    attach = getattr(returned, "attach_router", None)
    if not callable(attach):
        return [f"returned {returned!r}, which has no attach_router(app): the API server skips it"]
    from fastapi import FastAPI

    try:
        attach(FastAPI())
    except Exception as exc:
        return [f"attach_router(app) raised {type(exc).__name__}: {exc}"]
    return []


def _registry_changes(first: dict[str, dict[str, str]],
                      second: dict[str, dict[str, str]]) -> dict[str, dict[str, list[str | None]]]:
    """``{kind: {name: [before, after]}}`` for every registration that differs."""
    changed = {
        kind: {n: [first.get(kind, {}).get(n), second[kind].get(n)]
               for n in set(first.get(kind, {})) | set(second[kind])
               if first.get(kind, {}).get(n) != second[kind].get(n)}
        for kind in second
    }
    return {k: v for k, v in changed.items() if v}


def _check_registered(registered: list[tuple[str, str]], result: dict[str, Any]) -> list[str]:
    """Import every class the plugin registered and check it against its registry's base.

    Records ``{kind: {name: target}}`` under ``result["registered"]``.

    Returns:
        One problem per registration that does not import or has the wrong type.
    """
    from forkless.plugins._registry import all_registries, describe_target

    registries = all_registries()
    problems: list[str] = []
    report: dict[str, dict[str, str]] = {}
    for kind, name in sorted(set(registered)):
        registry = registries.get(kind)
        if registry is None or name not in registry:
            continue  # unregistered again by the plugin itself: nothing to import
        target = registry.get_path(name) or describe_target(registry.resolve(name))
        report.setdefault(kind, {})[name] = target
        problem = _resolve_problem(registry, name)
        if problem is not None:
            problems.append(f"registered {kind} {name!r} -> {target!r} is broken: {problem}")
    result["registered"] = report
    return problems


def _check_lora_resolvers(result: dict[str, Any]) -> list[str]:
    """Build every LoRA resolver the plugin registered, as the API server does on a request
    for an unknown model: a path that does not import, or a class that cannot be built,
    fails the check instead of every such request.

    ``LoRAResolverRegistry`` is not one of the lazy registries (its resolvers may be
    instances, vLLM's contract), so :func:`_check_registered` does not see it. This process
    loaded no other plugin, so whatever it holds, this plugin registered.
    """
    module = sys.modules.get("forkless.lora.registry")
    if module is None:
        return []  # the plugin never imported it: it registered no resolver
    registry = module.LoRAResolverRegistry
    targets = registry.snapshot()
    if targets:
        result.setdefault("registered", {})["LoRA resolver"] = targets
    problems = []
    for name, target in targets.items():
        try:
            registry.get_resolver(name)
        except Exception as exc:  # PluginImportError, TypeError, or whatever __init__ raised
            problems.append(f"registered LoRA resolver {name!r} -> {target!r} is broken: "
                            f"{type(exc).__name__}: {exc}")
    return problems


def _resolve_problem(registry: Any, name: str) -> str | None:
    """Why ``registry.resolve(name)`` does not give a subclass of its base, or ``None``."""
    try:
        obj = registry.resolve(name)
    except Exception as exc:  # PluginImportError, TypeError, or whatever the module raised
        return f"{type(exc).__name__}: {exc}"
    base = registry.base
    # resolve() checks the base only for paths; an object registered directly is
    # returned as it was given.
    if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
        return f"{obj!r} is not a subclass of {base.__module__}.{base.__qualname__}"
    return None


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
