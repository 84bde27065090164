"""The hardware floor of the throughput workload: the bytes that must move, the FLOPs that
must run.

The model of a continuous batch (stated again in ``forkless bench throughput``'s output):

* **Decode reads the KV cache.** A request of ``i`` prompt tokens and ``o`` output tokens
  gets its first token from the prefill, then runs ``o - 1`` decode steps; decode step
  ``k`` (1-based) attends over ``i + k`` tokens, so it reads ``(o - 1) * i + (o - 1) * o / 2``
  tokens' KV in all, each ``layers * 2 * kv_heads * head_dim * KV element bytes`` (K and V;
  the element is the model dtype's, or one byte with ``--kv-cache-dtype fp8``).
* **Each decode step reads the weights once**, whatever the batch: every matrix but the
  input embedding table (of which only the batch's rows are read), the LM head included.
  The number of steps is that of a batch of ``max_num_seqs`` slots filled in request
  order, each request holding its slot for its ``o - 1`` decode steps and a freed slot
  taken at once by the next request (prefills ride along in decode steps, as with
  chunked prefill): with every request fitting, the longest output minus one. KV-cache
  capacity is assumed not to limit the batch.
* **Prefill is compute**: ``2 * matmul params`` FLOPs per prompt token (the LM head only on
  each prompt's last position) plus causal attention, ``2 * layers * heads * head_dim *
  i * (i + 1)`` FLOPs per prompt (QK^T and PV over ``i (i + 1) / 2`` query-key pairs).
* **A decode step is bound by its reads or by its FLOPs, whichever takes longer**: ``2 *
  (matmul params + LM head)`` FLOPs per running sequence, plus ``4 * layers * heads *
  head_dim * context`` for its attention. On a GPU the reads win every step of these
  workloads; on a CPU at batch ~30 the two are close, so the step's time is the larger.
  Prefill does not overlap decode: floor = sum over decode steps of max(bytes /
  bandwidth, FLOPs / peak FLOP/s) + prefill FLOPs / peak FLOP/s.

The bandwidth is a device copy measured in the same run (``forkless.bench.latency.copy_bandwidth``);
the peak FLOP/s is :data:`PEAK_TFLOPS` for the device name (``--peak-tflops`` overrides),
or, on the CPU, a matmul in the run's dtype measured in the same run.
"""

from __future__ import annotations

import heapq
import json
import time
from dataclasses import dataclass
from pathlib import Path

#: Dense BF16/FP16 tensor-core peak TFLOP/s by device-name substring (vendor data sheets;
#: SXM parts). The first match in this order wins.
PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
}


@dataclass(frozen=True)
class ModelShape:
    """What the floor needs of a decoder-only transformer."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    num_params: int
    tied_embeddings: bool
    dtype_bytes: int
    #: Bytes of one KV-cache element; ``None``: ``dtype_bytes`` (``--kv-cache-dtype auto``).
    kv_dtype_bytes: int | None = None

    @property
    def kv_element_bytes(self) -> int:
        return self.kv_dtype_bytes if self.kv_dtype_bytes is not None else self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.kv_element_bytes

    @property
    def matmul_params(self) -> int:
        """Parameters used as matmul weights per token: all but the embedding and LM head."""
        embed = self.vocab_size * self.hidden_size
        return self.num_params - embed * (1 if self.tied_embeddings else 2)

    @property
    def weight_bytes_per_step(self) -> int:
        """The matmul weights plus the LM head (the input embedding table is not read whole)."""
        return (self.matmul_params + self.vocab_size * self.hidden_size) * self.dtype_bytes


#: Bytes per KV-cache element of the quantized ``--kv-cache-dtype`` values.
KV_CACHE_DTYPE_BYTES: dict[str, int] = {"fp8": 1, "fp8_e4m3": 1}


def kv_dtype_bytes(kv_cache_dtype: str | None, dtype_bytes: int) -> int:
    """Bytes of one KV-cache element: ``dtype_bytes`` for ``auto``, 1 for fp8."""
    if kv_cache_dtype in (None, "auto"):
        return dtype_bytes
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(f"--kv-cache-dtype={kv_cache_dtype!r} is invalid: expected auto or one of "
                         f"{', '.join(KV_CACHE_DTYPE_BYTES)}")
    return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]


def shape_from_config(config: dict, num_params: int, dtype_bytes: int,
                      kv_dtype_bytes: int | None = None) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` dict (``kv_dtype_bytes``:
    the KV-cache element size when it differs from the model dtype's)."""
    heads = config["num_attention_heads"]
    return ModelShape(
        num_layers=config["num_hidden_layers"], num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        hidden_size=config["hidden_size"], vocab_size=config["vocab_size"], num_params=num_params,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)), dtype_bytes=dtype_bytes,
        kv_dtype_bytes=kv_dtype_bytes)


def count_parameters(model: str | Path) -> int:
    """Parameter count of a model folder (built on the meta device: no memory, no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    return sum(p.numel() for p in m.parameters())


def load_shape(model: str | Path, dtype_bytes: int, kv_dtype_bytes: int | None = None) -> ModelShape:
    """The shape of a model folder; ``kv_dtype_bytes`` as in :func:`shape_from_config`."""
    config = json.loads((Path(model) / "config.json").read_text())
    return shape_from_config(config.get("text_config", config), count_parameters(model), dtype_bytes,
                             kv_dtype_bytes)


def decode_spans(output_lens: list[int], max_num_seqs: int) -> list[tuple[int, int]]:
    """Each request's decode steps ``[start, end)`` in the continuous batch (see the module
    docstring): list scheduling of ``o - 1`` steps per request on ``max_num_seqs`` slots,
    in request order."""
    slots = [0] * min(max_num_seqs, len(output_lens))
    spans = []
    for o in output_lens:
        start = heapq.heappop(slots)
        end = start + max(o - 1, 0)
        heapq.heappush(slots, end)
        spans.append((start, end))
    return spans


def decode_steps(output_lens: list[int], max_num_seqs: int) -> int:
    """Decode steps of the continuous batch: the last request's decode ends there."""
    return max((end for _, end in decode_spans(output_lens, max_num_seqs)), default=0)


@dataclass
class Floor:
    """The workload's floor and the quantities it is made of."""

    kv_bytes: int
    weight_bytes: int
    decode_steps: int
    prefill_flops: int
    bandwidth: float
    peak_flops: float
    output_tokens: int
    #: FLOPs of all decode steps (the LM head and attention included).
    decode_flops: int = 0
    #: Sum over decode steps of max(the step's bytes / bandwidth, its FLOPs / peak).
    decode_seconds: float = 0.0

    @property
    def memory_seconds(self) -> float:
        """The decode steps' reads alone, at the bandwidth."""
        return (self.kv_bytes + self.weight_bytes) / self.bandwidth

    @property
    def compute_seconds(self) -> float:
        """The prefill's FLOPs at the peak."""
        return self.prefill_flops / self.peak_flops

    @property
    def decode_compute_bound_share(self) -> float:
        """How much longer the decode steps take than their reads alone would (0: every
        step bound by its reads)."""
        return max(self.decode_seconds / self.memory_seconds - 1.0, 0.0) if self.memory_seconds else 0.0

    @property
    def seconds(self) -> float:
        return self.decode_seconds + self.compute_seconds

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def throughput_floor(shape: ModelShape, work: list[tuple[int, int]], max_num_seqs: int, bandwidth: float,
                     peak_flops: float) -> Floor:
    """The floor of ``work`` (``(input length, output length)`` per request), in request order."""
    spans = decode_spans([o for _, o in work], max_num_seqs)
    steps = max((end for _, end in spans), default=0)
    attn_per_pair = 4 * shape.num_layers * shape.num_heads * shape.head_dim  # QK^T and PV, per (query, key)
    attn = sum(attn_per_pair * i * (i + 1) // 2 for i, _ in work)
    head = shape.vocab_size * shape.hidden_size
    prefill = 2 * shape.matmul_params * sum(i for i, _ in work) + 2 * head * len(work) + attn
    # Each step's running sequences and their summed context, by difference arrays over
    # the steps: a request started at step s runs its k-th decode (k = 1 .. o - 1) at step
    # s + k - 1 over i + k tokens, so at step t its context is (i - s + 1) + t.
    running = [0] * (steps + 1)
    offset = [0] * (steps + 1)
    for (i, _), (start, end) in zip(work, spans):
        if end > start:
            running[start] += 1
            running[end] -= 1
            offset[start] += i - start + 1
            offset[end] -= i - start + 1
    per_seq_flops = 2 * (shape.matmul_params + head)
    decode_flops, decode_seconds, count, context_offset, kv_tokens = 0, 0.0, 0, 0, 0
    for t in range(steps):
        count += running[t]
        context_offset += offset[t]
        context = context_offset + count * t
        kv_tokens += context
        flops = count * per_seq_flops + attn_per_pair * context
        nbytes = shape.weight_bytes_per_step + context * shape.kv_bytes_per_token
        decode_flops += flops
        decode_seconds += max(nbytes / bandwidth, flops / peak_flops)
    return Floor(kv_bytes=kv_tokens * shape.kv_bytes_per_token, weight_bytes=steps * shape.weight_bytes_per_step,
                 decode_steps=steps, prefill_flops=prefill, bandwidth=bandwidth, peak_flops=peak_flops,
                 output_tokens=sum(o for _, o in work), decode_flops=decode_flops, decode_seconds=decode_seconds)


def peak_flops(device: str, override_tflops: float | None = None, dtype: str = "float32") -> tuple[float, str]:
    """``(FLOP/s, where it came from)``: the override, the table by CUDA device name, or a
    matmul measured on the CPU in ``dtype`` (or in bfloat16 on an unknown GPU)."""
    if override_tflops is not None:
        return override_tflops * 1e12, "--peak-tflops"
    if device != "cpu":
        import torch

        name = torch.cuda.get_device_name()
        for key, tflops in PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12, f"{name} data sheet, dense bf16"
        return measured_matmul_flops(device, "bfloat16"), f"{name}: best measured bf16 matmul"
    return measured_matmul_flops("cpu", dtype), f"best measured {dtype} matmul on the CPU (torch's, forkless's)"


def measured_matmul_flops(device: str, dtype: str, n: int = 2048, repeats: int = 5) -> float:
    """The best FLOP/s of an ``n x n`` matmul over ``repeats`` (after a warm-up): a limit is
    what the machine was seen to do, not its typical run. On the CPU the best of torch's
    matmul and forkless's own packed layer for ``dtype`` where it has one
    (:func:`forkless.models.layers.cpu_linear.cpu_linear_for`), which is faster on some CPUs
    (bfloat16 on AVX512-BF16 without AMX): a floor priced at the slower one was beaten by
    forkless's own runs."""
    import torch

    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    products = [lambda: a @ a]
    if device == "cpu":
        from forkless.models.layers.cpu_linear import cpu_linear_dtype_supported, cpu_linear_for

        if cpu_linear_dtype_supported(a.dtype):
            packed = cpu_linear_for(a)
            products.append(lambda: packed(a))
    best = float("inf")
    with torch.inference_mode():
        for product in products:
            product()  # warm-up
            for _ in range(repeats):
                if device != "cpu":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                product()
                if device != "cpu":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def _si(value: float, unit: str) -> str:
    """``1.234 TB``, ``56.7 GB``, ... : the largest prefix that keeps the number >= 1."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3f} {prefix}{unit}"
    return f"{value:.3f} {unit}"


def describe(fl: Floor, bandwidth_source: str, flops_source: str, max_num_seqs: int) -> list[str]:
    """The lines ``forkless bench throughput`` prints."""
    return [
        f"floor: KV reads {_si(fl.kv_bytes, 'B')} + weights {_si(fl.weight_bytes, 'B')} "
        f"({fl.decode_steps} decode steps) at {_si(fl.bandwidth, 'B/s')} ({bandwidth_source}) "
        f"= {fl.memory_seconds:.3f} s; decode {_si(fl.decode_flops, 'FLOP')}, steps bound by the larger of "
        f"reads and FLOPs: {fl.decode_seconds:.3f} s (+{fl.decode_compute_bound_share:.0%} over the reads); "
        f"prefill {_si(fl.prefill_flops, 'FLOP')} at {_si(fl.peak_flops, 'FLOP/s')} ({flops_source}) "
        f"= {fl.compute_seconds:.3f} s",
        f"floor: {fl.seconds:.3f} s = {fl.tokens_per_s:.1f} output tok/s (model: each decode step reads every "
        f"running sequence's KV and the weights once, or computes, whichever is longer; {max_num_seqs} slots "
        f"filled in request order; prefill compute-bound; no overlap)",
    ]
