"""Online serving: ``forkless bench serve`` (``vllm bench serve``'s flags and table) with
this folder's small CPU workload as defaults.

Starts ``forkless serve`` (the embedded default model unless a MODEL is given), times it
from process start to ``/health`` OK, then runs ``forkless bench serve``: 16 streaming
completions of random token ids, input 40-120 and output 32-96 tokens (``--random-input-len
80 --random-output-len 64 --random-range-ratio 0.5``), all at once, after 2 warm-up
requests; the server gets ``--max-model-len 1024 --max-num-seqs 64 --kv-cache-memory
512 MiB``. Any ``forkless bench serve`` flag overrides these (``--server-args ...`` last).

``--startup-only`` times start -> ``/health`` OK only (and the SIGTERM -> exit that ends
each), ``--repeat K`` times, and prints each start with the load average, then the
medians. The wait for ``/health`` costs the server no CPU: the port listens from the
server's first second on, so one request waits in its backlog until the app answers (a
poll loop creating HTTP clients every 20 ms took CPU from the server on 2 cores).
``--baseline-rev REV`` also starts the code of git revision REV (a temporary worktree,
removed after), alternating with this tree, and prints the ratios of the medians; one
untimed start of each comes first (kernel and model caches).
Each tree's package is byte-compiled first, as ``make serve`` does (``make bytecode``).

    python benchmarks/serve.py
    python benchmarks/serve.py --num-prompts 32 --max-concurrency 8 --request-rate 4
    python benchmarks/serve.py --startup-only --repeat 3
    python benchmarks/serve.py --startup-only --repeat 5 --baseline-rev fd27748
"""

from __future__ import annotations

import contextlib
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Iterator

from forkless.bench.serve import free_port, stop_server
from forkless.entrypoints.cli.main import main as forkless_main

BENCH_DEFAULTS = ["--num-prompts", "16", "--random-input-len", "80", "--random-output-len", "64",
                  "--random-range-ratio", "0.5", "--num-warmups", "2"]
SERVER_DEFAULTS = ["--max-model-len", "1024", "--max-num-seqs", "64", "--kv-cache-memory", str(512 << 20),
                   "--disable-log-stats"]
TARGET_S = 5.0  # issue 21: median <= 5 s over 3 starts on a 2-core machine
REPO = Path(__file__).resolve().parent.parent


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(benchmark flags, flags after ``--server-args``)."""
    if "--server-args" in argv:
        i = argv.index("--server-args")
        return argv[:i], argv[i + 1:]
    return argv, []


def take_option(argv: list[str], name: str) -> str | None:
    """Remove ``name VALUE`` from ``argv``; return VALUE (None when absent)."""
    if name not in argv:
        return None
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def time_start(serve_args: list[str], log: IO[bytes], tree: Path | None,
               timeout: float = 300) -> tuple[float, float]:
    """Seconds from launching ``forkless serve`` (of ``tree``, default this one) to a 200 from
    ``/health``, and from the SIGTERM that follows to the server's exit (its engine core
    and workers are stopped before it exits)."""
    port = free_port()
    env = dict(os.environ)
    if tree is not None:  # its forkless before the installed (editable) one, in every process
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", *serve_args, "--port", str(port)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            cwd=tree or REPO)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"forkless serve exited with {proc.returncode}; see {log.name}")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"no /health OK within {timeout} s; see {log.name}")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    started = time.perf_counter() - t0
                    break
            except (ConnectionRefusedError, TimeoutError, http.client.HTTPException, OSError):
                time.sleep(0.02)  # not listening yet (or not answering yet: ask again)
            finally:
                conn.close()
        t1 = time.perf_counter()
        stop_server(proc)
        return started, time.perf_counter() - t1
    finally:
        stop_server(proc)


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A temporary detached worktree of ``rev``, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="forkless-baseline-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    try:
        compile_package(path)
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False,
                       capture_output=True)


def compile_package(tree: Path) -> None:
    """Write the byte-code of ``tree``'s ``forkless`` package, as ``make bytecode`` does for
    this tree (without it every process compiles what it imports: ~0.7 s of a start)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "forkless")], check=True)


def startup_only(argv: list[str]) -> None:
    """Time ``forkless serve`` start -> ``/health`` OK ``--repeat K`` times (alternating
    with ``--baseline-rev REV`` when given)."""
    bench, server = split(argv)
    repeat = int(take_option(bench, "--repeat") or 1)
    rev = take_option(bench, "--baseline-rev")
    model = [a for a in bench if not a.startswith("-")]
    args = [*model, *SERVER_DEFAULTS, *server]
    log = tempfile.NamedTemporaryFile("wb", prefix="forkless-serve-", suffix=".log", delete=False)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; log: {log.name}", flush=True)
    compile_package(REPO)
    with contextlib.ExitStack() as stack:
        trees: dict[str, Path | None] = {"this tree": None}
        if rev is not None:
            trees = {f"baseline {rev}": stack.enter_context(worktree(rev)), "this tree": None}
            for name, tree in trees.items():
                print(f"{name}: untimed first start {time_start(args, log, tree)[0]:.2f} s", flush=True)
        times: dict[str, list[float]] = {name: [] for name in trees}
        stops: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(repeat):
            for name, tree in trees.items():  # alternated: a burst of load hits both
                before = loadavg()
                seconds, stop = time_start(args, log, tree)
                times[name].append(seconds)
                stops[name].append(stop)
                print(f"{name}: start -> /health OK: {seconds:.2f} s, SIGTERM -> exit: {stop:.2f} s "
                      f"(load average {before})", flush=True)
    for name, samples in times.items():
        print(f"{name}: median {statistics.median(samples):.2f} s over {len(samples)} starts "
              f"(min {min(samples):.2f}, max {max(samples):.2f}; target <= {TARGET_S:g} s); "
              f"stop median {statistics.median(stops[name]):.2f} s")
    if rev is not None:
        base = f"baseline {rev}"
        ratio = statistics.median(times["this tree"]) / statistics.median(times[base])
        stop_ratio = statistics.median(stops["this tree"]) / statistics.median(stops[base])
        print(f"this tree / baseline {rev}: start {ratio:.2f}x, stop {stop_ratio:.2f}x (medians); "
              f"load average now {loadavg()}")


def main() -> int:
    argv = sys.argv[1:]
    if "--startup-only" in argv:
        startup_only([a for a in argv if a != "--startup-only"])
        return 0
    bench, server = split(argv)
    return forkless_main(["bench", "serve", *BENCH_DEFAULTS, *bench, "--server-args", *SERVER_DEFAULTS, *server])


if __name__ == "__main__":
    sys.exit(main())
