"""How long forkless takes to find and load its plugins, against a plain entry-point scan.

For 100, 600 and 3,000 synthetic installed distributions (10 % of them forkless
plugins, each requiring ``forkless>=0.1``, half of the rest with console scripts, as real
environments have), each measurement runs in a fresh interpreter and times, inside it:

* ``baseline``: ``importlib.metadata.entry_points()`` (the plain scan);
* ``forkless``: discover and load every forkless group (general plugins called, forkless's
  own among them), no cache;
* ``forkless+cache``: the same with the entry-point cache warm.

The three alternate round by round (``--repeat`` rounds), so that load from other work on
the machine falls on all three alike; each figure is the median over the rounds, with the
spread (min-max) and the load average (``/proc/loadavg``) before and after. It also prints
what the timed region imported (the fixed cost of the first plugin load), and checks that
registering 50 models by path imports none of their modules.

Usage: ``python benchmarks/plugin_discovery.py [--sizes 100,600,3000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BASELINE = """
import time, importlib.metadata as md
t = time.perf_counter(); md.entry_points(); dt = time.perf_counter() - t
print(dt)
"""

FORKLESS = """
import json, sys, time
import forkless.plugins as p
before = set(sys.modules)
t = time.perf_counter()
p.load_general_plugins()
for group in p.GROUPS:
    p.load_plugins_by_group(group)
dt = time.perf_counter() - t
records = p.plugin_records()
assert sum(r.status == "loaded" and r.dist.startswith("synthdist") for r in records) == {expected}, records
assert not [r for r in records if r.status in ("failed", "incompatible")], records
new = sorted(m for m in set(sys.modules) - before if not m.startswith("synthdist"))
print(json.dumps(new))
print(dt)
"""

LAZY_50 = """
import sys, json
from forkless import ModelRegistry
before = set(sys.modules)
for i in range(50):
    ModelRegistry.register_model(f"Bench{i}ForCausalLM", f"bench_models.model_{i}:Bench{i}")
new = sorted(m for m in set(sys.modules) - before if m.startswith("bench_models"))
print(json.dumps(new))
"""


def make_site(root: Path, n: int) -> int:
    """Write ``n`` distributions into ``root``; returns the number of forkless plugins."""
    plugins = 0
    for i in range(n):
        dist = f"synthdist{i:05d}"
        info = root / f"{dist}-1.{i % 7}.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.{i % 7}.0\n"
            "Requires-Dist: requests>=2\nRequires-Dist: forkless>=0.1\n\nA synthetic package.\n")
        (info / "RECORD").write_text("")
        if i % 10 == 0:
            plugins += 1
            (root / f"{dist}.py").write_text(
                "def register():\n    from forkless import ModelRegistry\n"
                f"    ModelRegistry.register_model('Synth{i}ForCausalLM', '{dist}_model:Model')\n")
            (info / "entry_points.txt").write_text(
                f"[console_scripts]\n{dist} = {dist}:main\n\n"
                f"[forkless.general_plugins]\n{dist} = {dist}:register\n")
        elif i % 2 == 0:
            (info / "entry_points.txt").write_text(
                f"[console_scripts]\n{dist} = {dist}:main\n{dist}-x = {dist}.cli:run\n")
    # Byte-compiled, as pip install leaves a package (with PYTHONDONTWRITEBYTECODE=1 set,
    # as on the shared machines, each plugin import would otherwise compile its source).
    compileall.compile_dir(str(root), quiet=1)
    return plugins


def run_fresh(code: str, env: dict[str, str]) -> tuple[float, list[str]]:
    """(seconds ``code`` reported, the JSON list it printed before, if any) in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    return float(lines[-1]), json.loads(lines[-2]) if len(lines) > 1 else []


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def spread(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:.1f} ({min(samples) * 1e3:.1f}-{max(samples) * 1e3:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,600,3000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = []
    load_before = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            site = Path(tmp) / f"site{n}"
            expected = make_site(site, n)
            # The site first; a PYTHONPATH already set (another forkless tree) stays after it.
            pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
            base_env = {**os.environ, "PYTHONPATH": pythonpath, "FORKLESS_CACHE_ROOT": str(Path(tmp) / f"cache{n}"),
                        "FORKLESS_LOGGING_LEVEL": "ERROR"}
            base_env.pop("FORKLESS_PLUGINS", None)
            code = FORKLESS.format(expected=expected)
            nocache_env = {**base_env, "FORKLESS_PLUGIN_CACHE": "0"}
            _, imported_nocache = run_fresh(code, nocache_env)  # also warms the OS's file cache
            _, imported_warming = run_fresh(code, base_env)  # writes the entry-point cache
            _, imported_cached = run_fresh(code, base_env)
            samples: dict[str, list[float]] = {"baseline": [], "nocache": [], "cached": []}
            for _ in range(args.repeat):  # alternated: a burst of load hits all three
                samples["baseline"].append(run_fresh(BASELINE, base_env)[0])
                samples["nocache"].append(run_fresh(code, nocache_env)[0])
                samples["cached"].append(run_fresh(code, base_env)[0])
            med = {k: statistics.median(v) for k, v in samples.items()}
            rows.append({"distributions": n, "plugins": expected,
                         "baseline_ms": med["baseline"] * 1e3, "forkless_ms": med["nocache"] * 1e3,
                         "forkless_cached_ms": med["cached"] * 1e3,
                         "ratio": med["nocache"] / med["baseline"], "ratio_cached": med["cached"] / med["baseline"],
                         "spread": {k: spread(v) for k, v in samples.items()},
                         "samples_ms": {k: [round(x * 1e3, 2) for x in v] for k, v in samples.items()},
                         "imported_nocache": imported_nocache, "imported_cached": imported_cached,
                         "imported_writing_cache": imported_warming})
        lazy_env = {**os.environ, "FORKLESS_PLUGINS": ""}
        out = subprocess.run([sys.executable, "-c", LAZY_50], env=lazy_env, capture_output=True,
                             text=True, check=True).stdout
        imported = json.loads(out.strip().splitlines()[-1])
    load_after = loadavg()
    print(f"medians of {args.repeat} fresh interpreters each (min-max), ms; load average before {load_before}, "
          f"after {load_after}")
    print(f"{'dists':>6} {'plugins':>7} {'plain scan':>20} {'forkless':>20} {'cached':>20} "
          f"{'ratio':>6} {'ratio cached':>12}")
    for r in rows:
        sp = r["spread"]
        print(f"{r['distributions']:>6} {r['plugins']:>7} {sp['baseline']:>20} {sp['nocache']:>20} "
              f"{sp['cached']:>20} {r['ratio']:>5.2f}x {r['ratio_cached']:>11.2f}x")
    print("targets: ratio <= 1.10x without cache, <= 0.40x with cache")
    for r in rows:
        print(f"{r['distributions']} dists: the timed region imported {len(r['imported_nocache'])} modules without "
              f"the cache ({', '.join(r['imported_nocache']) or 'none'}); {len(r['imported_cached'])} with it")
    print(f"registering 50 models by path imported {len(imported)} of their modules")
    print(json.dumps({"rows": rows, "lazy_imported": imported, "load_before": load_before, "load_after": load_after,
                      "repeat": args.repeat}))


if __name__ == "__main__":
    main()
