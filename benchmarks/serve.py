"""Online serving: ``forkless bench serve`` (``vllm bench serve``'s flags and table) with
this folder's small CPU workload as defaults.

Starts ``forkless serve`` (the embedded default model unless a MODEL is given), times it
from process start to ``/health`` OK, then runs ``forkless bench serve``: 16 streaming
completions of random token ids, input 40-120 and output 32-96 tokens (``--random-input-len
80 --random-output-len 64 --random-range-ratio 0.5``), all at once, after 2 warm-up
requests; the server gets ``--max-model-len 1024 --max-num-seqs 64 --kv-cache-memory
512 MiB``. Any ``forkless bench serve`` flag overrides these (``--server-args ...`` last).

    python benchmarks/serve.py
    python benchmarks/serve.py --num-prompts 32 --max-concurrency 8 --request-rate 4
    python benchmarks/serve.py --startup-only --repeat 3
"""

from __future__ import annotations

import statistics
import sys
import tempfile

from forkless.bench.serve import free_port, start_server, stop_server
from forkless.entrypoints.cli.main import main as forkless_main

BENCH_DEFAULTS = ["--num-prompts", "16", "--random-input-len", "80", "--random-output-len", "64",
                  "--random-range-ratio", "0.5", "--num-warmups", "2"]
SERVER_DEFAULTS = ["--max-model-len", "1024", "--max-num-seqs", "64", "--kv-cache-memory", str(512 << 20),
                   "--disable-log-stats"]


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(benchmark flags, flags after ``--server-args``)."""
    if "--server-args" in argv:
        i = argv.index("--server-args")
        return argv[:i], argv[i + 1:]
    return argv, []


def startup_only(argv: list[str]) -> None:
    """Time ``forkless serve`` start -> ``/health`` OK ``--repeat K`` times."""
    bench, server = split(argv)
    repeat = int(bench[bench.index("--repeat") + 1]) if "--repeat" in bench else 1
    model = [a for a in bench if not a.startswith("-") and a != str(repeat)]
    log = tempfile.NamedTemporaryFile("wb", prefix="forkless-serve-", suffix=".log", delete=False)
    times = []
    for _ in range(repeat):
        proc, seconds = start_server([*model, *SERVER_DEFAULTS, *server], free_port(), log)
        stop_server(proc)
        times.append(seconds)
        print(f"start -> /health OK: {seconds:.2f} s", flush=True)
    print(f"median {statistics.median(times):.2f} s over {len(times)} starts (target <= 10 s)")


def main() -> int:
    argv = sys.argv[1:]
    if "--startup-only" in argv:
        startup_only([a for a in argv if a != "--startup-only"])
        return 0
    bench, server = split(argv)
    return forkless_main(["bench", "serve", *BENCH_DEFAULTS, *bench, "--server-args", *SERVER_DEFAULTS, *server])


if __name__ == "__main__":
    sys.exit(main())
