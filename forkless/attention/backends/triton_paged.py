"""The paged GPU attention backend ("triton"): Triton kernels over the paged KV cache.

Same cache layout as the reference backend, so the two are interchangeable and the
reference is the oracle in tests. Every step stores the new keys/values first and then
attends over the cache, so prefill, chunked prefill, prefix-cache hits and decode share
one kernel. The forward pass reads no device value on the host and launches grids that
depend only on shapes and ``max_query_len``: it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools

import torch
import triton

from forkless.attention.interface import AttentionMetadata
from forkless.attention.backends.torch_sdpa import TorchAttentionBackend
from forkless.attention.backends.triton_kernels import (
    LOG2E,
    combine_splits_kernel,
    paged_attention_kernel,
    store_kv_kernel,
)

# Query rows (token x GQA head) per program in prefill tiles.
_PREFILL_ROWS = 64
_BLOCK_N = 64
_MAX_SPLITS = 16


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class TritonAttentionBackend(TorchAttentionBackend):
    """Paged attention in Triton (prefill with cached context, batched decode).

    Falls back to the reference implementation only when there is no KV cache (the
    worker's profiling run), since the kernels read keys through the cache.
    """

    name = "triton"
    #: The forward pass may be captured in a CUDA graph (see the model runner).
    supports_cuda_graphs = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int = 0) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, layer_idx)
        self.group = num_heads // num_kv_heads
        self.block_d = triton.next_power_of_2(head_dim)
        #: Fixed number of decode context splits (tests); ``None`` chooses from the GPU.
        self.decode_splits: int | None = None

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
        store_kv_kernel[(num_tokens,)](
            k, v, kv_cache, md.slot_mapping,
            k.stride(0), v.stride(0), kv_cache.stride(0),
            HKV_D=hkv_d, BLOCK=triton.next_power_of_2(hkv_d),
        )
        out = torch.empty(num_tokens, self.num_heads, self.head_dim, dtype=q.dtype, device=q.device)
        num_seqs = md.seq_lens.shape[0]
        if md.max_query_len == 1:
            block_q = 1
            block_m = max(16, triton.next_power_of_2(self.group))
            splits = self._decode_splits(num_seqs, q.device)
        else:
            block_q = max(1, _PREFILL_ROWS // self.group)
            block_m = max(16, triton.next_power_of_2(block_q * self.group))
            splits = 1
        tiles = splits if splits > 1 else triton.cdiv(md.max_query_len, block_q)
        part_acc = part_ml = out  # unused placeholders when not splitting
        if splits > 1:
            part_acc = torch.empty(num_seqs * splits * self.num_heads, self.head_dim,
                                   dtype=torch.float32, device=q.device)
            part_ml = torch.empty(num_seqs * splits * self.num_heads, 2, dtype=torch.float32, device=q.device)
        paged_attention_kernel[(num_seqs, tiles, self.num_kv_heads)](
            q, out, kv_cache, md.block_tables, md.seq_lens, md.query_start_loc,
            part_acc, part_ml,
            self.scale * LOG2E,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            md.block_tables.stride(0), kv_cache.stride(0), md.block_size,
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group,
            HEAD_DIM=self.head_dim, BLOCK_D=self.block_d,
            BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=_BLOCK_N,
            NUM_SPLITS=splits, IEEE=q.dtype == torch.float32,
            num_warps=4,
        )
        if splits > 1:
            combine_splits_kernel[(num_seqs, self.num_heads)](
                part_acc, part_ml, out, md.query_start_loc, out.stride(0), out.stride(1),
                NUM_HEADS=self.num_heads, HEAD_DIM=self.head_dim, BLOCK_D=self.block_d,
                NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
            )
        return out.view(num_tokens, self.num_heads * self.head_dim)

    def _decode_splits(self, num_seqs: int, device: torch.device) -> int:
        """Split the context when (sequence, KV head) programs alone would leave SMs idle."""
        if self.decode_splits is not None:
            return self.decode_splits
        if device.type != "cuda":
            return 1
        programs = num_seqs * self.num_kv_heads
        target = 2 * _sm_count(device.index or 0)
        if programs >= target:
            return 1
        return min(_MAX_SPLITS, triton.cdiv(target, programs))
