"""The paged GPU attention backend ("triton"): Triton kernels over the paged KV cache.

Same cache layout as the reference backend, so the two are interchangeable and the
reference is the oracle in tests. Every step stores the new keys/values first and then
attends over the cache, so prefill, chunked prefill, prefix-cache hits and decode share
one kernel. The forward pass reads no device value on the host and launches grids that
depend only on shapes, ``max_query_len`` and ``block_size``: it can be captured in a
CUDA graph.

The cache holds the model dtype (``--kv-cache-dtype auto``) or float8 e4m3
(``fp8``/``fp8_e4m3``, one byte per element), told apart by the cache tensor's dtype; the
per-layer scales are ``k_scale`` / ``v_scale`` (1.0, as vLLM without checkpoint scales).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from forkless.attention.interface import AttentionMetadata, KVStoreTarget
from forkless.attention.piecewise import active_splitter
from forkless.attention.backends.torch_sdpa import TorchAttentionBackend
from forkless.attention.backends.triton_kernels import (
    LOG2E,
    combine_splits_kernel,
    paged_attention_kernel,
    store_kv_kernel,
)
from forkless.triton_utils.pdl import use_pdl

_MAX_SPLITS = 16


class DecodeLaunch(NamedTuple):
    """How a decode step's attention is launched (all host integers).

    Attributes:
        kv_per_prog: KV heads one program attends (a divisor of ``num_kv_heads``).
        block_n: Tokens per key tile.
        num_warps: Warps per program.
        num_stages: Software-pipelining depth of the key/value loads.
        splits: Context splits per (sequence, KV-head group); ``None``: chosen from the
            number of programs and the GPU's SM count.
        fp8_via_fp16: With an fp8 cache and 16-bit queries, convert keys/values (and the
            queries) to float16 rather than to the query dtype (see ``triton_kernels``).
            Off by default: not yet run on a GPU (the route through the query dtype is the
            one measured and tested on the H200).
        keys_first: Compute the scores transposed, the key tile as the dot's first
            operand (no transpose of a converted fp8 tile); not yet run on a GPU.
        heads_fast: Order the grid (KV-head group, split, sequence), so that one
            sequence's head programs run together over the same cache blocks.
        fp8_dot: With an fp8 cache and 16-bit queries, the scores as one fp8 dot: the
            queries rounded to e4m3 per row, the keys as they lie (implies
            ``keys_first``: Hopper's fp8 MMA needs the 64 key rows as the first operand;
            Triton converts a 16-row fp8 dot to float16). The default over fp8 caches,
            taken on Hopper and newer (others read the keys as bfloat16).
        longest_first: Walk the sequences in order of decreasing length (sorted on the
            device once a step), so that the longest contexts' programs start first and
            the last wave of programs holds short ones.
    """

    kv_per_prog: int = 1
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    splits: int | None = None
    fp8_via_fp16: bool = False
    keys_first: bool = False
    heads_fast: bool = False
    fp8_dot: bool = False
    longest_first: bool = False


#: The decode launch before the tuning of issue #14 (one KV head per program, 64-token
#: tiles, 3 stages), kept so ``benchmarks/attention_bw.py`` can measure against it.
DECODE_BASELINE = DecodeLaunch()
#: The default decode launch. Measured on an H200 (bf16, Qwen3-0.6B's heads, contexts of
#: 100-2048 tokens; benchmarks/README.md): 2 pipeline stages instead of 3 read the cache at
#: 0.963 of the copy bandwidth at batch 512 (0.939 before) and 0.894 at batch 256 (0.875),
#: and need a third less shared memory, so every dtype and head size that compiled before
#: still does. More KV heads per program, 16- or 32-token tiles and 8 warps were all slower
#: at both batches; 128-token tiles with 3 stages matched 2 stages at 512 (0.963) and beat
#: it at 256 (0.914), but need twice the shared memory (too much for float32 or head
#: size 256). The grid puts a sequence's head programs side by side (``heads_fast``), and
#: the sequences are walked longest first: on an H100 (same shapes, 2026-12-05) 118.3 /
#: 377.7 / 723.8 us at batch 64 / 256 / 512 against 122.8 / 390.9 / 737.3 for the launch
#: before (which took 128-token tiles at batches split at most in two; with the longest
#: first, 64-token tiles are the faster at every batch: 386.1 / 731.7 us with 128).
DECODE_DEFAULT = DecodeLaunch(num_stages=2, heads_fast=True, longest_first=True)
#: The default decode launch over an fp8 cache with 16-bit queries and heads of at most 128:
#: 128-token tiles (the bytes of a 64-token bf16 tile), the scores as an fp8 dot. Measured
#: on an H200 (same shapes, benchmarks/README.md): 565 us at batch 512 against 654 us with
#: 64-token tiles, 316 against 362 us at 256, 124 against 146 us at 64; then with the fp8
#: dot 475 / 264 / 92 us (faster than a bf16 cache's 532 us at 512), for a relative error of
#: 2.6e-2 against the reference over the dequantized cache instead of 2.2e-3 (the queries'
#: rounding to e4m3).
DECODE_DEFAULT_FP8 = DecodeLaunch(block_n=128, num_stages=2, heads_fast=True, fp8_dot=True)


class PrefillLaunch(NamedTuple):
    """How a prefill or mixed step's attention is launched (host values only).

    Attributes:
        rows: Query rows (token x GQA head pairs) per program: ``rows // group`` tokens of
            one KV head's query heads.
        block_n: Tokens per key tile.
        num_warps: Warps per program.
        num_stages: Software-pipelining depth of the key/value loads.
        split_causal: Attend the keys every query row of a tile sees (those before its
            first query's position) in a loop of unmasked key tiles, and only the rest with
            the causal mask.
    """

    rows: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    split_causal: bool = False


#: The prefill launch where the faster one below does not fit: 64 query rows (32 tokens of
#: a KV head's two query heads in Qwen3-0.6B), 64-token key tiles, 3 stages, every tile
#: masked; every dtype and head size fits it.
PREFILL_DEFAULT = PrefillLaunch()
#: The prefill launch for 16-bit queries and heads of at most 128: 128 x 128 tiles, the keys
#: before a tile's first query attended unmasked (``split_causal``). Swept on an H100
#: (benchmarks/README.md, "Longest-first decode, and split-causal prefill"): 1.21x faster
#: than ``PREFILL_DEFAULT`` over the sweep's four steps (1.25x on one 8,192-token prompt).
#: Its tiles need 160 KiB of shared memory with bf16 heads of 128 (an H100 has 227), twice
#: that with float32 or heads of 256, which keep ``PREFILL_DEFAULT``.
PREFILL_SPLIT = PrefillLaunch(rows=128, block_n=128, num_warps=8, num_stages=2, split_causal=True)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _fp8_mma(index: int) -> bool:
    """Whether the GPU multiplies fp8 matrices at 64 rows (Hopper's wgmma; ``fp8_dot`` is
    only worth its query rounding there, and older GPUs lack the e4m3 dot)."""
    return torch.cuda.get_device_capability(index)[0] >= 9


class TritonAttentionBackend(TorchAttentionBackend):
    """Paged attention in Triton (prefill with cached context, batched decode).

    Falls back to the reference implementation only when there is no KV cache (the
    worker's profiling run), since the kernels read keys through the cache.
    """

    name = "triton"
    #: The forward pass may be captured in a CUDA graph (see the model runner).
    supports_cuda_graphs = True
    #: Prefill and mixed steps may run as graphs between eager attention calls.
    supports_piecewise_graphs = True
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3")

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int = 0) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, layer_idx)
        self.group = num_heads // num_kv_heads
        self.block_d = triton.next_power_of_2(head_dim)
        #: Fixed number of decode context splits (tests); ``None`` chooses from the GPU.
        self.decode_splits: int | None = None
        #: Fixed decode launch (benchmarks, tests); ``None`` uses :meth:`decode_launch`.
        self.decode_override: DecodeLaunch | None = None
        #: Fixed prefill launch (benchmarks, tests); ``None`` uses :meth:`prefill_launch`.
        self.prefill_override: PrefillLaunch | None = None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        if kv_cache is None or kv_cache.numel() == 0:
            return super().forward(q, k, v, kv_cache, attn_metadata)
        md = attn_metadata
        num_tokens = q.shape[0]
        hkv_d = self.num_kv_heads * self.head_dim
        k = k if k.stride(-1) == 1 and k.stride(-2) == self.head_dim else k.contiguous()
        v = v if v.stride(-1) == 1 and v.stride(-2) == self.head_dim else v.contiguous()
        pdl = use_pdl(q.device, num_tokens)
        store_kv_kernel[(num_tokens,)](
            k, v, kv_cache, md.slot_mapping,
            k.stride(0), v.stride(0), kv_cache.stride(0),
            1.0 / self.k_scale, 1.0 / self.v_scale,
            HKV_D=hkv_d, BLOCK=triton.next_power_of_2(hkv_d), KV_FP8=kv_cache.dtype == torch.float8_e4m3fn,
            PDL=pdl, launch_pdl=pdl,
        )
        return self.forward_stored(q, kv_cache, md)

    def kv_store_target(self, kv_cache: torch.Tensor | None, attn_metadata: AttentionMetadata) -> KVStoreTarget | None:
        # The profiling run (no cache) attends through the reference backend.
        if kv_cache is None or kv_cache.numel() == 0 or not kv_cache.is_cuda:
            return None
        return KVStoreTarget(kv_cache, attn_metadata.slot_mapping, 1.0 / self.k_scale, 1.0 / self.v_scale)

    def forward_stored(self, q: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: AttentionMetadata,
                       output: torch.Tensor | None = None) -> torch.Tensor:
        splitter = active_splitter()
        if splitter is not None:  # a piecewise capture: attention runs between the graphs
            return splitter.split(self, q, kv_cache, attn_metadata)
        md = attn_metadata
        num_tokens = q.shape[0]
        kv_fp8 = kv_cache.dtype == torch.float8_e4m3fn
        pdl = use_pdl(q.device, num_tokens)
        out = output if output is not None else torch.empty(
            num_tokens, self.num_heads, self.head_dim, dtype=q.dtype, device=q.device)
        num_seqs = md.seq_lens.shape[0]
        if md.max_query_len == 1:
            launch = self.decode_launch(num_seqs, q.device, kv_fp8=kv_fp8 and q.dtype != torch.float32)
            kv_per_prog, block_n, splits = launch.kv_per_prog, launch.block_n, launch.splits
            block_q = 1
            block_m = max(16, triton.next_power_of_2(kv_per_prog * self.group))
            num_warps, num_stages = launch.num_warps, launch.num_stages
            split_causal, ordered = False, launch.longest_first
            via_fp16, keys_first, heads_fast = launch.fp8_via_fp16, launch.keys_first, launch.heads_fast
            fp8_dot = (launch.fp8_dot and kv_fp8 and q.dtype in (torch.bfloat16, torch.float16)
                       and _fp8_mma(q.device.index or 0))
            keys_first = keys_first or fp8_dot
        else:
            prefill = self.prefill_launch(q.dtype)
            kv_per_prog, block_n, splits = 1, prefill.block_n, 1
            block_q = max(1, prefill.rows // self.group)
            block_m = max(16, triton.next_power_of_2(block_q * self.group))
            num_warps, num_stages, split_causal = prefill.num_warps, prefill.num_stages, prefill.split_causal
            ordered = False
            via_fp16 = keys_first = heads_fast = fp8_dot = False
        # 0: the cache holds q's dtype; 1: fp8 read as q's dtype; 2: fp8 read as float16;
        # 3: fp8 scores from e4m3 queries (values as 1).
        fp8_mode = (0 if not kv_fp8 else 3 if fp8_dot
                    else 2 if via_fp16 and q.dtype in (torch.bfloat16, torch.float16) else 1)
        assert splits is not None
        tiles = splits if splits > 1 else triton.cdiv(md.max_query_len, block_q)
        part_acc, part_ml = self._split_partials(out, num_seqs, splits)
        groups = self.num_kv_heads // kv_per_prog
        paged_attention_kernel[(groups, tiles, num_seqs) if heads_fast else (num_seqs, tiles, groups)](
            q, out, kv_cache, md.block_tables, md.seq_lens, md.query_start_loc,
            self._longest_first(md) if ordered else md.seq_lens,
            part_acc, part_ml,
            self.scale * LOG2E * (self.k_scale if kv_fp8 else 1.0), self.v_scale,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            md.block_tables.stride(0), kv_cache.stride(0), md.block_size,
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group,
            HEAD_DIM=self.head_dim, BLOCK_D=self.block_d,
            BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
            KV_PER_PROG=kv_per_prog, ONE_BLOCK=md.block_size % block_n == 0, KV_FP8=fp8_mode, KEYS_FIRST=keys_first,
            NUM_SPLITS=splits, IEEE=q.dtype == torch.float32, HEADS_FAST=heads_fast, PDL=pdl, SPLIT_CAUSAL=split_causal,
            ORDERED=ordered,
            num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl,
        )
        if splits > 1:
            self._combine_splits(part_acc, part_ml, out, md, splits, pdl)
        return out.view(num_tokens, self.num_heads * self.head_dim)

    @staticmethod
    def _longest_first(md: AttentionMetadata) -> torch.Tensor:
        """The batch's sequence indexes by decreasing length (on the device), sorted once a
        step: the first layer sorts, the others reuse it (inside a CUDA graph the sort is
        captured once and runs at every replay). Ties in any order."""
        order = md.backend_state.get("triton_longest_first")
        if order is None:
            order = torch.argsort(md.seq_lens, descending=True)
            md.backend_state["triton_longest_first"] = order
        return order

    def _split_partials(self, out: torch.Tensor, num_seqs: int,
                        splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers of a split decode's partial results: ``acc`` ``[B * S * Hq, D]`` and
        ``(m, l)`` ``[B * S * Hq, 2]`` in float32 (``out`` twice, unused, without splits)."""
        if splits == 1:
            return out, out
        rows = num_seqs * splits * self.num_heads
        return (torch.empty(rows, self.head_dim, dtype=torch.float32, device=out.device),
                torch.empty(rows, 2, dtype=torch.float32, device=out.device))

    def _combine_splits(self, part_acc: torch.Tensor, part_ml: torch.Tensor, out: torch.Tensor,
                        md: AttentionMetadata, splits: int, pdl: bool) -> None:
        """Merge a split decode's partial softmaxes into ``out``."""
        combine_splits_kernel[(md.seq_lens.shape[0], self.num_heads)](
            part_acc, part_ml, out, md.query_start_loc, out.stride(0), out.stride(1),
            NUM_HEADS=self.num_heads, HEAD_DIM=self.head_dim, BLOCK_D=self.block_d,
            NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), PDL=pdl, launch_pdl=pdl,
        )

    def decode_launch(self, num_seqs: int, device: torch.device, kv_fp8: bool = False) -> DecodeLaunch:
        """The decode launch for a batch of ``num_seqs`` sequences (host integers only).

        Args:
            num_seqs: Sequences in the batch.
            device: Their device.
            kv_fp8: The cache holds fp8 and the queries are 16-bit.
        """
        launch = self.decode_override or (DECODE_DEFAULT_FP8 if kv_fp8 and self.head_dim <= 128 else DECODE_DEFAULT)
        kv_per_prog = launch.kv_per_prog if self.num_kv_heads % launch.kv_per_prog == 0 else 1
        # tl.dot needs at least 16 key rows.
        block_n = max(launch.block_n, triton.cdiv(16, kv_per_prog))
        splits = self.decode_splits if self.decode_splits is not None else launch.splits
        if splits is None:
            splits = self._decode_splits(num_seqs * (self.num_kv_heads // kv_per_prog), device)
        return launch._replace(kv_per_prog=kv_per_prog, block_n=block_n, splits=splits)

    def prefill_launch(self, dtype: torch.dtype) -> PrefillLaunch:
        """The launch of a prefill or mixed step's attention (host values only).

        Args:
            dtype: The queries' dtype.
        """
        if self.prefill_override is not None:
            return self.prefill_override
        fits = dtype in (torch.bfloat16, torch.float16) and self.block_d <= 128
        return PREFILL_SPLIT if fits else PREFILL_DEFAULT

    def _decode_splits(self, programs: int, device: torch.device) -> int:
        """Split the context when the (sequence, KV-head group) programs are too few to keep
        enough loads in flight: below 8 per SM, enough splits for ~16 per SM (a power of two,
        so that few variants compile).

        Fitted on an H200 (132 SMs; benchmarks/README.md, "The collector fix measured, and
        small-batch decode attention"):
        Qwen3-0.6B's heads, contexts of 100-2,048 tokens, 64-token tiles: 8 splits at batch
        32 took 45.9 us against 50.3 with the 2 the earlier rule (split below 2 programs per
        SM) gave, 4 at batch 64 94.4 against 100.0 (no split), 2 at batch 128 160.0 against
        169.9; at batch 256 and up splitting was slower.
        """
        if device.type != "cuda":
            return 1
        sms = _sm_count(device.index or 0)
        if programs >= 8 * sms:
            return 1
        want = min(_MAX_SPLITS, triton.cdiv(16 * sms, programs))
        return 1 << (want.bit_length() - 1)  # rounded down to a power of two
