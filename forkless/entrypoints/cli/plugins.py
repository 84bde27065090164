"""``forkless plugins list | check | bisect`` (DESIGN.md §5)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from forkless import envs
from forkless.plugins import (
    ENDPOINT_PLUGINS_GROUP,
    GENERAL_PLUGINS_GROUP,
    GROUPS,
    IO_PROCESSOR_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    call_plugin,
    installed_entry_points,
    load_general_plugins,
    load_plugins_by_group,
    plugin_records,
)

_CALLED_GROUPS = (PLATFORM_PLUGINS_GROUP, IO_PROCESSOR_PLUGINS_GROUP, ENDPOINT_PLUGINS_GROUP)


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


def load_everything() -> None:
    """Load every allowed plugin of every group, calling those whose value is a callable."""
    load_general_plugins()
    for group in GROUPS:
        if group == GENERAL_PLUGINS_GROUP:
            continue
        for name, obj in load_plugins_by_group(group).items():
            if group in _CALLED_GROUPS and callable(obj):
                call_plugin(group, name, obj)


def cmd_list(args: argparse.Namespace) -> int:
    load_everything()
    rows = [r.to_dict() for r in plugin_records()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no forkless plugins are installed")
        return 0
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
    return 0


# -- check ------------------------------------------------------------------------------


def _run_check(group: str, name: str, timeout: float) -> dict[str, Any]:
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
            print(f"error: no installed plugin named {', '.join(unknown)}; installed: "
                  f"{', '.join(sorted(known)) or '(none)'}", file=sys.stderr)
            return 2
        entries = [e for e in entries if e.name in args.names]
    results = [_run_check(e.group, e.name, args.timeout) for e in entries]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            status = "ok  " if r["ok"] else "FAIL"
            load = f"{r['load_ms']:.1f} ms" if r.get("load_ms") is not None else "-"
            print(f"{status} {r['name']} ({r['group']}, {r.get('dist', '?')}) load {load}")
            mods = r.get("imported_modules")
            if mods is not None:
                print(f"     imported during registration: {', '.join(mods) or '(nothing new)'}")
            for problem in r["problems"]:
                print(f"     problem: {problem}")
        if not results:
            print("no forkless plugins are installed")
    return 0 if all(r["ok"] for r in results) else 1


# -- bisect -----------------------------------------------------------------------------


def _fails(cmd: list[str], names: list[str], timeout: float) -> bool:
    env = dict(os.environ, FORKLESS_PLUGINS=",".join(names))
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return True
    return proc.returncode != 0


def bisect_plugins(cmd: list[str], names: list[str], timeout: float,
                   log: Any = print) -> str | None:
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
    lo, hi = 0, len(names)  # invariant: names[:lo] passes, names[:hi] fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        failed = _fails(cmd, names[:mid], timeout)
        log(f"  with {mid} plugin(s) ({', '.join(names[:mid]) or 'none'}): "
            f"{'fails' if failed else 'passes'}")
        lo, hi = (lo, mid) if failed else (mid, hi)
    return names[hi - 1]


def cmd_bisect(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("error: give the command after --: forkless plugins bisect -- CMD ...",
              file=sys.stderr)
        return 2
    entries = installed_entry_points()
    listed = envs.FORKLESS_PLUGINS
    if listed is None:
        candidates = {e.name for e in entries if not GROUPS.get(e.group, GROUPS[GENERAL_PLUGINS_GROUP]).opt_in}
    else:
        wanted = {n.strip() for n in listed.split(",") if n.strip()}
        candidates = {e.name for e in entries if e.name in wanted}
    names = sorted(candidates)
    import shutil

    if shutil.which(cmd[0]) is None:
        print(f"error: command not found: {cmd[0]!r}", file=sys.stderr)
        return 2
    print(f"bisecting {len(names)} plugin(s): {', '.join(names) or '(none)'}")
    if _fails(cmd, [], args.timeout):
        print("the command fails with no plugin loaded (FORKLESS_PLUGINS=''): "
              "the failure is not caused by a plugin")
        return 1
    culprit = bisect_plugins(cmd, names, args.timeout)
    if culprit is None:
        print("the command succeeds with all of these plugins loaded: nothing to bisect")
        return 1
    alone = _fails(cmd, [culprit], args.timeout)
    how = "on its own" if alone else "together with the plugins loaded before it"
    print(f"culprit: {culprit} (the command fails when it is loaded, {how})")
    print(f"run without it: FORKLESS_PLUGINS={','.join(n for n in names if n != culprit)}")
    return 0
