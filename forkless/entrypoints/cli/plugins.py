"""``forkless plugins list | check | bisect`` (DESIGN.md §5).

Invariants:
    * Only public names of :mod:`forkless.plugins` are used; what each group's values are
      comes from :data:`forkless.plugins.GROUPS`.
    * ``list`` loads exactly what a forkless process would (``FORKLESS_PLUGINS`` and all),
      calls the callables, and under ``FORKLESS_PLUGINS_STRICT=1`` still prints the table,
      then one error naming every failed plugin and exits 1; each plugin's traceback is
      logged once, by the loader.
    * ``check`` runs each plugin in its own fresh process (``forkless.plugins._check``).
    * ``bisect`` never changes the environment but ``FORKLESS_PLUGINS``, which it sets
      to explicit allow-lists.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Callable

from forkless.plugins import (
    GENERAL_PLUGINS_GROUP,
    GROUPS,
    LOGITS_PROCESSOR_GROUP,
    STAT_LOGGER_PLUGINS_GROUP,
    PluginLoadError,
    PluginRecord,
    ValueKind,
    call_plugins_by_group,
    installed_entry_points,
    load_general_plugins,
    load_plugins_by_group,
    plugin_records,
    plugin_selection,
    unknown_group_message,
    vllm_group_hint,
)

# `plugins check` prints at most this many newly imported modules per plugin.
_MAX_MODULES_SHOWN = 8
# A load slower than this is called out: every process that loads the group pays it.
SLOW_LOAD_MS = 1000.0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("plugins", help="list, check and bisect installed plugins")
    sub = parser.add_subparsers(dest="plugins_command", required=True)

    p_list = sub.add_parser("list", help="every installed plugin of every group, with its status")
    p_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p_list.set_defaults(func=cmd_list)

    p_check = sub.add_parser(
        "check", help="load each plugin in a fresh process, call it twice, report problems")
    p_check.add_argument("names", nargs="*", help="entry-point names (default: all)")
    p_check.add_argument("--json", action="store_true", help="print JSON instead of text")
    p_check.add_argument("--timeout", type=float, default=120.0,
                         help="seconds allowed per plugin (default 120)")
    p_check.set_defaults(func=cmd_check)

    p_bisect = sub.add_parser(
        "bisect", help="find the plugin whose loading makes a command fail",
        usage="forkless plugins bisect [--timeout S] -- CMD [ARG ...]")
    p_bisect.add_argument("--timeout", type=float, default=600.0,
                          help="seconds allowed per run of CMD; a run over it counts as failing")
    p_bisect.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run")
    p_bisect.set_defaults(func=cmd_bisect)


# -- list -------------------------------------------------------------------------------


def load_everything() -> list[PluginRecord]:
    """Load every allowed plugin of every group, calling those whose value is a callable.

    Returns:
        The plugins that failed, when strict mode made them errors (else empty): every
        group is still loaded, so that all failures are reported together.
    """
    failed: list[PluginRecord] = []
    for spec in GROUPS.values():
        try:
            if spec.name == GENERAL_PLUGINS_GROUP:
                load_general_plugins()
            elif spec.kind is ValueKind.CALLABLE:
                call_plugins_by_group(spec.name)
            elif spec.name in _FAMILY_CHECKS:
                _FAMILY_CHECKS[spec.name]()  # loads the group, then refuses what its family cannot use
            else:
                load_plugins_by_group(spec.name)
        except PluginLoadError as exc:
            failed.extend(exc.records)
    return failed


def _stat_loggers() -> None:
    from forkless.metrics import load_stat_logger_plugin_factories

    load_stat_logger_plugin_factories()


def _logits_processors() -> None:
    from forkless.logits_processors.registry import load_custom_classes

    load_custom_classes(None)


#: Groups whose values the family checks beyond importing them: run here as the server
#: runs them, so that a plugin the server would skip is listed as failed, not loaded.
_FAMILY_CHECKS: dict[str, Callable[[], None]] = {
    STAT_LOGGER_PLUGINS_GROUP: _stat_loggers,
    LOGITS_PROCESSOR_GROUP: _logits_processors,
}


def cmd_list(args: argparse.Namespace) -> int:
    failed = load_everything()
    rows = [r.to_dict() for r in plugin_records()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    hint = vllm_group_hint()
    if hint:
        print(f"forkless plugins list: note: {hint}", file=sys.stderr)
    if failed:
        print(f"forkless plugins list: error: {PluginLoadError.for_records(failed)}",
              file=sys.stderr)
        return 1
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no forkless plugins are installed")
        return
    headers = ["group", "name", "value", "distribution", "status", "load ms", "error"]
    table = [
        [r["group"], r["name"], r["value"], f"{r['dist']} {r['version']}", r["status"],
         "" if r["load_ms"] is None else f"{r['load_ms']:.1f}", (r["error"] or "")[:80]]
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


# -- check ------------------------------------------------------------------------------


def _run_check(group: str, name: str, timeout: float) -> dict[str, Any]:
    if group not in GROUPS:  # nothing to load it by: say why, as plugins list does
        return {"group": group, "name": name, "ok": False, "problems": [unknown_group_message(group)]}
    cmd = [sys.executable, "-m", "forkless.plugins._check", group, name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"group": group, "name": name, "ok": False,
                "problems": [f"loading did not finish within {timeout:g} s"]}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"group": group, "name": name, "ok": False,
                "problems": [f"the check process exited with {proc.returncode} and no report"],
                "stderr": proc.stderr[-4000:]}


def cmd_check(args: argparse.Namespace) -> int:
    entries = installed_entry_points()
    if args.names:
        known = {e.name for e in entries}
        unknown = [n for n in args.names if n not in known]
        if unknown:
            hint = vllm_group_hint(unknown)
            close = [m for n in unknown for m in difflib.get_close_matches(n, sorted(known), n=1)]
            print(f"forkless plugins check: error: no installed plugin named {', '.join(unknown)}"
                  + (f" (did you mean {', '.join(close)}?)" if close else "")
                  + f"; installed: {', '.join(sorted(known)) or '(none)'}" + (f". {hint}" if hint else ""),
                  file=sys.stderr)
            return 2
        entries = [e for e in entries if e.name in args.names]
    results = [_run_check(e.group, e.name, args.timeout) for e in entries]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            _print_check(r)
        if not results:
            print("no forkless plugins are installed")
    if not args.names:
        # What forkless never loads cannot be checked; a ported plugin whose group was not
        # renamed would otherwise pass "check all" unseen (a note: a vLLM install's own
        # plugins may sit there on purpose).
        hint = vllm_group_hint()
        if hint:
            print(f"forkless plugins check: note: {hint}", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


def _print_check(r: dict[str, Any]) -> None:
    status = "ok  " if r["ok"] else "FAIL"
    load = f"{r['load_ms']:.1f} ms" if r.get("load_ms") is not None else "-"
    print(f"{status} {r['name']} ({r['group']}, {r.get('dist', '?')}) load {load}")
    if r.get("inactive"):
        print("     inactive: it returned None (its device or feature is absent here), so "
              "forkless does not use it on this machine")
    mods = r.get("imported_modules")
    if mods is not None:
        print(f"     imported during registration: {_shorten(mods)}")
    heavy = r.get("heavy_imports")
    if heavy and r["group"] != GENERAL_PLUGINS_GROUP:  # a general plugin's is a problem
        # Not a failure (vLLM's own examples import torch at module level), but the list
        # above may hide it past its first names, and it costs the API server's start.
        names = ", ".join(heavy)
        print(f"     note: loading it imported {names}; the API server loads {r['group']} plugins "
              f"too and otherwise never imports {names}: import {'them' if len(heavy) > 1 else 'it'} "
              "inside the methods that use it")
    if (r.get("load_ms") or 0) > SLOW_LOAD_MS:
        where = GROUPS[r["group"]].loaded_in if r["group"] in GROUPS else "each process that loads it"
        print(f"     note: slow: loading took {r['load_ms'] / 1e3:.1f} s, paid at every start (loaded in: "
              f"{where}); do the slow part on first use instead")
    for problem in r["problems"]:
        print(f"     problem: {problem}")


def _shorten(names: list[str], limit: int = _MAX_MODULES_SHOWN) -> str:
    """``a, b, c`` or, past ``limit`` names, the first ones then ``… and N more``."""
    if not names:
        return "(nothing new)"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} … and {len(names) - limit} more"


# -- bisect -----------------------------------------------------------------------------


def _fails(cmd: list[str], names: list[str], timeout: float) -> bool:
    env = dict(os.environ, FORKLESS_PLUGINS=",".join(names))
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return True
    return proc.returncode != 0


def _bisect(cmd: list[str], names: list[str], timeout: float, log: Callable[[str], Any],
            passing: int) -> int:
    """Index of the first plugin whose addition makes ``cmd`` fail.

    Requires that ``cmd`` passes with ``names[:passing]`` and fails with ``names``.
    """
    lo, hi = passing, len(names)  # invariant: names[:lo] passes, names[:hi] fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        failed = _fails(cmd, names[:mid], timeout)
        log(f"  with {mid} plugin(s) ({', '.join(names[:mid]) or 'none'}): "
            f"{'fails' if failed else 'passes'}")
        lo, hi = (lo, mid) if failed else (mid, hi)
    return hi - 1


def bisect_plugins(cmd: list[str], names: list[str], timeout: float,
                   log: Callable[[str], Any] = print) -> str | None:
    """Find the first plugin (in load order) whose addition makes ``cmd`` fail.

    Args:
        cmd: The command; it fails by exiting non-zero (or by running past ``timeout``).
        names: Candidate plugin names, in load order.
        timeout: Seconds per run.
        log: Called with a line of progress per run.

    Returns:
        The culprit's name, or ``None`` when ``cmd`` does not fail with all of them.
    """
    if not _fails(cmd, names, timeout):
        return None
    return names[_bisect(cmd, names, timeout, log, 0)]


def find_culprits(cmd: list[str], names: list[str], timeout: float,
                  log: Callable[[str], Any] = print) -> list[str]:
    """Every plugin that must be left out for ``cmd`` to pass, one bisection at a time.

    After each culprit, ``cmd`` runs without all the culprits found so far; while it still
    fails, more culprits remain and the bisection goes on over the rest. It starts from
    the prefix the previous round saw pass, which holds no culprit, so each later round
    costs only the runs past it.

    Args:
        cmd: The command; it fails by exiting non-zero (or by running past ``timeout``).
        names: Candidate plugin names, in load order; ``cmd`` must pass with none of them
            and fail with all of them.
        timeout: Seconds per run.
        log: Called with a line of progress per run and per culprit.

    Returns:
        The culprits, in the order found (load order).
    """
    culprits: list[str] = []
    remaining = list(names)
    passing = 0
    while remaining:
        index = _bisect(cmd, remaining, timeout, log, passing)
        culprit = remaining.pop(index)
        culprits.append(culprit)
        passing = index  # remaining[:index] passed, and the culprit was not in it
        alone = _fails(cmd, [culprit], timeout)
        how = "on its own" if alone else "together with the plugins loaded before it"
        log(f"culprit: {culprit} (the command fails when it is loaded, {how})")
        still_fails = bool(remaining) and _fails(cmd, remaining, timeout)
        log(f"  without {', '.join(culprits)} ({len(remaining)} plugin(s)): "
            f"{'still fails: more than one culprit, bisecting the rest' if still_fails else 'passes'}")
        if not still_fails:
            break
    return culprits


def _candidates() -> list[str]:
    """The plugins a forkless process would load under the current ``FORKLESS_PLUGINS``."""
    selection = plugin_selection()
    general = GROUPS[GENERAL_PLUGINS_GROUP]
    return sorted({e.name for e in installed_entry_points()
                   if selection.allows(e.name, GROUPS.get(e.group, general).opt_in)})


def cmd_bisect(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("error: give the command after --: forkless plugins bisect -- CMD ...",
              file=sys.stderr)
        return 2
    if shutil.which(cmd[0]) is None:
        print(f"error: command not found: {cmd[0]!r}", file=sys.stderr)
        return 2
    names = _candidates()
    print(f"bisecting {len(names)} plugin(s): {', '.join(names) or '(none)'}")
    if _fails(cmd, [], args.timeout):
        print("the command fails with no plugin loaded (FORKLESS_PLUGINS=''): "
              "the failure is not caused by a plugin")
        return 1
    if not _fails(cmd, names, args.timeout):
        print("the command succeeds with all of these plugins loaded: nothing to bisect")
        return 1
    culprits = find_culprits(cmd, names, args.timeout)
    keep = ",".join(n for n in names if n not in culprits)
    if len(culprits) == 1:
        print(f"run without it: FORKLESS_PLUGINS={keep}")
    else:
        print(f"culprits: {', '.join(culprits)} (the command passes only without all of them)")
        print(f"run without them: FORKLESS_PLUGINS={keep}")
    return 0
