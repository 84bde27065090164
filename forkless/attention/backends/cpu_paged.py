"""The CPU attention backend: decode and prefill read the paged KV cache in place with C
kernels.

Decode, which is bound by reading the cache, runs ``forkless/cpu_kernels/csrc/paged_decode.c``:
it walks each sequence's block table and reads every key and value once, where gather + SDPA
copies them out first and reads the copy back. Every float32 prefill -- a fresh prompt, or a
chunk on top of cached context (chunked prefill, a prefix-cache hit) -- runs
``paged_prefill.c`` the same way once the step's keys are stored, its query tokens tiled so
they share each key and value load. Over cached context gather + SDPA copied the whole
context on every layer, which for a chunk of a few tokens costs far more than its
arithmetic: the kernel was faster at each of 2 to 2,048 new tokens over 512 to 7,500 cached
ones (SmolLM2-135M's heads, 2-core EPYC: 1.4x at 2,048 tokens, 5x at 2). Fresh prompts went
to ``scaled_dot_product_attention``, one call per sequence and layer, until the kernel beat
it there too: the 64 prompts of 32-256 tokens of ``benchmarks/throughput.py``'s workload
spent 0.77 s in it against 1.74 s in SDPA (2-core AMD EPYC Zen 4, AVX-512). With a bfloat16
model and cache, decode and prefill run the same kernels over the bfloat16 cache
(``forkless_paged_decode_bf16`` / ``forkless_paged_prefill_bf16``: keys and values widened
to float32 as they are read, the query and the sums in float32, the output rounded to
bfloat16 once; the attention of the throughput workload's prefill and mixed steps took
1.58 s with SDPA for the prefills, 0.79 s in the kernels, 2-core Zen 4). Other dtypes, and
machines without a C compiler, take the torch path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from forkless import cpu_kernels
from forkless.attention.interface import AttentionMetadata
from forkless.attention.backends.torch_sdpa import TorchAttentionBackend, _build_plan, _Plan


@dataclass
class _KernelPlan:
    plan: _Plan
    seq_ids: torch.Tensor  # int32 [Bd]: row of each decoding sequence in block_tables/seq_lens
    q_rows: torch.Tensor  # int32 [Bd]: its token row in q and in the output
    context_ids: torch.Tensor  # int32 [Bc]: row of each prefill (float32: fresh ones too)
    context_starts: torch.Tensor  # int32 [Bc]: its first token row in q and in the output
    context_lens: torch.Tensor  # int32 [Bc]: its new tokens
    block_tables: torch.Tensor  # int32, contiguous
    seq_lens: torch.Tensor  # int32, contiguous
    block_size: int
    all_rows: bool  # the kernels write every row of the step


class CpuAttentionBackend(TorchAttentionBackend):
    """Paged attention for CPUs (the cpu platform's default).

    Same cache layout as the torch reference, ``(2, num_blocks, block_size, num_kv_heads,
    head_dim)``, so the two are interchangeable on one cache.
    """

    name = "cpu"
    # The C kernels read float32 and bfloat16 caches (the model's dtype); an fp8 cache would
    # run the torch reference's casts at a fraction of their speed, so ask for
    # --attention-backend torch explicitly.
    supported_kv_cache_dtypes = ("auto",)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        lib = cpu_kernels.load()
        if (
            lib is None
            or q.device.type != "cpu"
            or q.dtype not in (torch.float32, torch.bfloat16)
            or kv_cache is None
            or kv_cache.dtype != q.dtype
        ):
            return super().forward(q, k, v, kv_cache, attn_metadata)
        kp = attn_metadata.backend_state.get("cpu")
        if kp is None:
            kp = attn_metadata.backend_state["cpu"] = self._kernel_plan(attn_metadata, q.shape[0])
        plan = kp.plan
        key_cache, value_cache = self._store(k, v, kv_cache, plan)
        # The kernels take float32 queries and write float32 outputs whatever the cache holds:
        # a bfloat16 step widens its queries and rounds its output once.
        suffix = "bf16" if q.dtype == torch.bfloat16 else "f32"
        qf = q.float().contiguous()
        out = qf.new_empty(qf.shape) if kp.all_rows else qf.new_zeros(qf.shape)
        if plan.decode_ids:
            assert key_cache is not None and value_cache is not None
            self._run_kernel(getattr(lib, f"forkless_paged_decode_{suffix}"), qf, key_cache, value_cache, kp,
                             (kp.seq_ids, kp.q_rows), len(kp.plan.decode_ids), out)
        if plan.context_ids:
            assert key_cache is not None and value_cache is not None
            # Every prefill (the plan lists none for SDPA), into its rows of ``out``.
            self._run_kernel(getattr(lib, f"forkless_paged_prefill_{suffix}"), qf, key_cache, value_cache, kp,
                             (kp.context_ids, kp.context_starts, kp.context_lens), len(kp.plan.context_ids), out)
        return out.to(q.dtype).view(q.shape[0], self.num_heads * self.head_dim)

    @staticmethod
    def _kernel_plan(md: AttentionMetadata, num_rows: int) -> _KernelPlan:
        plan = _build_plan(md, None, gather_decode=False, gather_context=False)

        def host_int32(cpu: torch.Tensor | None, dev: torch.Tensor) -> torch.Tensor:
            return (cpu if cpu is not None else dev).to(torch.int32).contiguous()

        qsl = host_int32(md.query_start_loc_cpu, md.query_start_loc)
        context_ids = torch.tensor(plan.context_ids, dtype=torch.int32)
        context_starts = qsl[context_ids.long()].contiguous()
        context_lens = (qsl[context_ids.long() + 1] - context_starts).contiguous()
        return _KernelPlan(
            plan,
            torch.tensor(plan.decode_ids, dtype=torch.int32),
            torch.tensor(plan.decode_rows, dtype=torch.int32),
            context_ids,
            context_starts,
            context_lens,
            md.block_tables.to(torch.int32).contiguous(),
            host_int32(md.seq_lens_cpu, md.seq_lens),
            md.block_size,
            not plan.prefills and len(plan.decode_ids) + int(context_lens.sum()) == num_rows,
        )

    def _run_kernel(
        self,
        kernel: Any,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        kp: _KernelPlan,
        rows: tuple[torch.Tensor, ...],
        num_seqs: int,
        out: torch.Tensor,
    ) -> None:
        """Call ``paged_decode.c`` or ``paged_prefill.c``: both take the paged cache and the
        step's block tables, then their per-sequence arrays ``rows``, then the head shape."""
        cpu_kernels.check(kernel(
            q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
            kp.block_tables.data_ptr(), kp.block_tables.stride(0), kp.seq_lens.data_ptr(),
            *(t.data_ptr() for t in rows), out.data_ptr(), num_seqs,
            self.num_heads, self.num_kv_heads, self.head_dim, kp.block_size, self.scale,
        ))
