"""How long forkless takes to find and load its plugins, against a plain entry-point scan.

For 100, 600 and 3,000 synthetic installed distributions (10 % of them forkless plugins,
half of the rest with console scripts, as real environments have), each measurement
runs in a fresh interpreter and times, inside it:

* ``baseline``: ``importlib.metadata.entry_points()`` (the plain scan);
* ``forkless``: discover and load every forkless group (general plugins called), no cache;
* ``forkless+cache``: the same with the entry-point cache warm.

It also checks that registering 50 models by path imports none of their modules.

Usage: ``python benchmarks/plugin_discovery.py [--sizes 100,600,3000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
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
import time
import forkless.plugins as p
t = time.perf_counter()
p.load_general_plugins()
for group in p.GROUPS:
    p.load_plugins_by_group(group)
dt = time.perf_counter() - t
assert sum(r.status == "loaded" for r in p.plugin_records()) == {expected}, p.plugin_records()
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
    return plugins


def time_fresh(code: str, env: dict[str, str], repeat: int) -> float:
    """Median seconds reported by ``code`` over ``repeat`` fresh interpreters."""
    samples = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        samples.append(float(out.strip().splitlines()[-1]))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,600,3000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            site = Path(tmp) / f"site{n}"
            expected = make_site(site, n)
            base_env = {**os.environ, "PYTHONPATH": str(site), "FORKLESS_CACHE_ROOT": str(Path(tmp) / f"cache{n}"),
                        "FORKLESS_LOGGING_LEVEL": "ERROR"}
            base_env.pop("FORKLESS_PLUGINS", None)
            code = FORKLESS.format(expected=expected)
            baseline = time_fresh(BASELINE, base_env, args.repeat)
            nocache = time_fresh(code, {**base_env, "FORKLESS_PLUGIN_CACHE": "0"}, args.repeat)
            time_fresh(code, base_env, 1)  # warm the cache
            cached = time_fresh(code, base_env, args.repeat)
            rows.append({"distributions": n, "plugins": expected, "baseline_ms": baseline * 1e3,
                         "forkless_ms": nocache * 1e3, "forkless_cached_ms": cached * 1e3,
                         "ratio": nocache / baseline, "ratio_cached": cached / baseline})
        lazy_env = {**os.environ, "FORKLESS_PLUGINS": ""}
        out = subprocess.run([sys.executable, "-c", LAZY_50], env=lazy_env, capture_output=True,
                             text=True, check=True).stdout
        imported = json.loads(out.strip().splitlines()[-1])
    print(f"{'dists':>6} {'plugins':>7} {'plain scan':>11} {'forkless':>9} {'cached':>8} "
          f"{'ratio':>6} {'ratio cached':>12}")
    for r in rows:
        print(f"{r['distributions']:>6} {r['plugins']:>7} {r['baseline_ms']:>9.1f}ms "
              f"{r['forkless_ms']:>7.1f}ms {r['forkless_cached_ms']:>6.1f}ms "
              f"{r['ratio']:>5.2f}x {r['ratio_cached']:>11.2f}x")
    print(f"targets: ratio <= 1.10x without cache, <= 0.40x with cache")
    print(f"registering 50 models by path imported {len(imported)} of their modules")
    print(json.dumps({"rows": rows, "lazy_imported": imported}))


if __name__ == "__main__":
    main()
