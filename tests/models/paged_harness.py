"""A minimal paged-KV-cache driver for testing models without the engine.

It plays the model runner's part: allocates per-layer caches with the backend's shape,
hands out blocks in a shuffled (non-contiguous) order, and builds AttentionMetadata for a
step in which every listed sequence adds some tokens.
"""

from __future__ import annotations

import torch

from forkless.attention import AttentionMetadata


class PagedHarness:
    def __init__(self, model, attn_backend, block_size: int = 4, num_blocks: int = 64, seed: int = 0):
        spec = type(model).get_kv_cache_spec(model.config)
        shape = attn_backend.get_kv_cache_shape(num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.model = model
        self.block_size = block_size
        self.kv_caches = [torch.zeros(shape, dtype=model.dtype) for _ in range(spec.num_layers)]
        gen = torch.Generator().manual_seed(seed)
        self.free_blocks = torch.randperm(num_blocks, generator=gen).tolist()
        self.block_tables: dict[str, list[int]] = {}
        self.seq_lens: dict[str, int] = {}

    def _slot(self, seq: str, pos: int) -> int:
        table = self.block_tables.setdefault(seq, [])
        while len(table) <= pos // self.block_size:
            table.append(self.free_blocks.pop())
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def build(self, batch: list[tuple[str, list[int]]], pad_tokens: int = 0):
        """Inputs and metadata for one step; updates the sequences' lengths."""
        ids, positions, slots, starts, lens = [], [], [], [0], []
        for seq, tokens in batch:
            ctx = self.seq_lens.get(seq, 0)
            for j, tok in enumerate(tokens):
                ids.append(tok)
                positions.append(ctx + j)
                slots.append(self._slot(seq, ctx + j))
            self.seq_lens[seq] = ctx + len(tokens)
            starts.append(starts[-1] + len(tokens))
            lens.append(ctx + len(tokens))
        # Padding rows, as a graph-capturing runner would add: never stored.
        ids += [0] * pad_tokens
        positions += [0] * pad_tokens
        slots += [-1] * pad_tokens
        max_blocks = max(len(self.block_tables[s]) for s, _ in batch)
        tables = [self.block_tables[s] + [-1] * (max_blocks - len(self.block_tables[s])) for s, _ in batch]
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            max_query_len=max(len(t) for _, t in batch),
            max_seq_len=max(lens),
            block_size=self.block_size,
        )
        return torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), md

    @torch.inference_mode()
    def step(self, batch: list[tuple[str, list[int]]], pad_tokens: int = 0) -> list[torch.Tensor]:
        """Run one step; returns each sequence's logits for its new tokens."""
        input_ids, positions, md = self.build(batch, pad_tokens)
        hidden = self.model(input_ids, positions, self.kv_caches, md)
        logits = self.model.compute_logits(hidden)
        starts = md.query_start_loc.tolist()
        return [logits[starts[i] : starts[i + 1]] for i in range(len(batch))]
