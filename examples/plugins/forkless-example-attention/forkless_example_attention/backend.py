"""Paged attention in plain torch, one sequence at a time: short and slow, but complete."""

import torch
import torch.nn.functional as F

from forkless.attention import AttentionBackend, AttentionMetadata


class NaiveAttentionBackend(AttentionBackend):
    name = "naive"

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int,
                           head_dim: int) -> tuple[int, ...]:
        # [0] keys, [1] values; row s holds slot s = block_id * block_size + offset.
        return (2, num_blocks * block_size, num_kv_heads, head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor | None, attn_metadata: AttentionMetadata) -> torch.Tensor:
        md = attn_metadata
        has_cache = kv_cache is not None and kv_cache.numel() > 0
        if has_cache:  # store the new keys and values (slot -1 = padding: not stored)
            slots = md.slot_mapping[: q.shape[0]]
            keep = slots >= 0
            kv_cache[0][slots[keep]] = k[keep].to(kv_cache.dtype)
            kv_cache[1][slots[keep]] = v[keep].to(kv_cache.dtype)
        out = q.new_zeros(q.shape[0], self.num_heads * self.head_dim)
        starts = md.query_start_loc.tolist()
        for i, seq_len in enumerate(md.seq_lens.tolist()):
            start, end = starts[i], starts[i + 1]
            if end == start:
                continue
            if has_cache:  # every key of the sequence, cached context included
                pos = torch.arange(seq_len, device=q.device)
                seq_slots = md.block_tables[i, pos // md.block_size].long() * md.block_size \
                    + pos % md.block_size
                keys, values = kv_cache[0][seq_slots].to(q.dtype), kv_cache[1][seq_slots].to(q.dtype)
            else:  # profiling run: no cache, so no cached context
                keys, values = k[start:end], v[start:end]
            # New token r sits at position seq_len - (end - start) + r: it sees keys up to it.
            q_pos = torch.arange(seq_len - (end - start), seq_len, device=q.device)
            mask = torch.arange(keys.shape[0], device=q.device)[None, :] <= q_pos[:, None]
            group = self.num_heads // self.num_kv_heads  # grouped-query attention
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),  # [Hq, q_len, D]
                keys.repeat_interleave(group, dim=1).transpose(0, 1),  # [Hq, seq_len, D]
                values.repeat_interleave(group, dim=1).transpose(0, 1),
                attn_mask=mask, scale=self.scale)
            out[start:end] = o.transpose(0, 1).reshape(end - start, -1)
        return out
