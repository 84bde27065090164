"""What the custom-op dispatch costs on the CPU: the layer ops per call, and a decode step.

forkless.ops binds each op's implementation once, when the op is built; before it, every
call asked which kernels to use (the tensor's device and dtype, and FORKLESS_FUSED_KERNELS
read from the environment). Both versions run here, each from its own tree: the current
checkout, and the baseline revision (``--baseline``, default: the commit before
forkless.ops) extracted with ``git archive``. Each measurement is a fresh process,
interleaved between the two trees, best of ``--repeats``, one thread, in CPU time
(``time.process_time``: on a shared machine, wall time mostly measures the neighbours):

* per call, in microseconds: RMSNorm (with and without the residual), rotary embeddings
  (in place on strided q/k views), SiLU-and-mul, through the layer classes a model uses
  (``forkless.models.layers.*``, the same path in both trees), at SmolLM2-135M's shapes
  (hidden 576, 9/3 heads of 64, intermediate 1,536), 1 and 16 rows;
* a decode step: an offline ``LLM`` on SmolLM2-135M's shape with random weights
  (``load_format="dummy"``) and a 512-token vocabulary (so the LM head does not hide the
  layers), greedy, ``--tokens`` tokens for 1 and 16 requests.

    python benchmarks/custom_ops.py [--baseline REV] [--repeats 3] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
         "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 2048,
         "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu",
         "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2}


def ops_child() -> dict:
    import torch

    from forkless.models.layers.activation import SiluAndMul
    from forkless.models.layers.norm import RMSNorm
    from forkless.models.layers.rotary import RotaryEmbedding

    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = {}
    norm = RMSNorm(576, 1e-5)
    rope = RotaryEmbedding(64, {"rope_type": "default", "rope_theta": 100000.0})
    act = SiluAndMul()
    with torch.inference_mode():
        for rows in (1, 16):
            x, res, h = torch.randn(rows, 576), torch.randn(rows, 576), torch.randn(rows, 2 * 1536)
            qkv = torch.randn(rows, (9 + 3 + 3) * 64)
            q, k = qkv[:, : 9 * 64].view(rows, 9, 64), qkv[:, 9 * 64 : 12 * 64].view(rows, 3, 64)
            positions = torch.arange(rows)
            cases = {"rms_norm": lambda: norm(x), "rms_norm + residual": lambda: norm(x, res),
                     "rotary_embedding": lambda: rope(positions, q, k), "silu_and_mul": lambda: act(h)}
            for name, call in cases.items():
                best = float("inf")
                for _ in range(7):
                    start = time.process_time()
                    for _ in range(2000):
                        call()
                    best = min(best, (time.process_time() - start) / 2000)
                out[f"{name}, {rows} row{'s' * (rows > 1)}"] = best * 1e6
    return out


def decode_child(model: str, tokens: int) -> dict:
    from forkless import LLM, SamplingParams

    llm = LLM(model, load_format="dummy", max_num_seqs=16, max_model_len=512, num_threads=1)
    out = {}
    for batch in (1, 16):
        prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 500 for j in range(16)]} for i in range(batch)]
        llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, detokenize=False)
        start = time.process_time()  # the engine and its worker run in this process
        llm.generate(prompts, params, use_tqdm=False)
        out[f"decode step, {batch} request{'s' * (batch > 1)} (ms)"] = (time.process_time() - start) / tokens * 1e3
    llm.shutdown()
    return out


def run_child(tree: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True,
                          text=True, cwd=tree, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child in {tree} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    import_root = result.pop("_forkless")
    assert import_root.startswith(str(tree)), f"the child imported forkless from {import_root}, not {tree}"
    return result


def extract(rev: str, out: Path) -> Path:
    """The ``forkless`` package of revision ``rev``, written under ``out``."""
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "forkless"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="e0e1c51", help="git revision before forkless.ops")
    parser.add_argument("--candidate", default=None,
                        help="git revision to compare (default: this checkout, as it is)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import forkless

        result = ops_child() if args.child[0] == "ops" else decode_child(args.child[1], int(args.child[2]))
        print(json.dumps({**result, "_forkless": str(Path(forkless.__file__).parent)}))
        return

    with tempfile.TemporaryDirectory() as tmp:
        base = extract(args.baseline, Path(tmp) / "baseline")
        candidate = extract(args.candidate, Path(tmp) / "candidate") if args.candidate else REPO
        from forkless.bench import shapes

        shapes.SHAPES.setdefault("smollm2-135m-v512", SHAPE)
        model = shapes.write_model_folder(Path(tmp) / "model", "smollm2-135m-v512", dtype="float32")
        trees = {"baseline": base, "forkless.ops": candidate}
        best: dict[str, dict[str, float]] = {name: {} for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():  # interleaved: both see the same load
                for child in (["ops"], ["decode", str(model), str(args.tokens)]):
                    for key, value in run_child(tree, *child).items():
                        best[name][key] = min(value, best[name].get(key, float("inf")))
    print(f"baseline {args.baseline} vs forkless.ops ({args.candidate or 'this checkout'}); "
          f"best of {args.repeats}, one thread, CPU time")
    print(f"{'':40s} {'baseline':>10s} {'ops':>10s} {'ops/base':>9s}")
    for key in best["baseline"]:
        unit = "" if key.endswith("(ms)") else " (µs)"
        a, b = best["baseline"][key], best["forkless.ops"][key]
        print(f"{key + unit:40s} {a:10.2f} {b:10.2f} {b / a:8.2f}x")


if __name__ == "__main__":
    main()
