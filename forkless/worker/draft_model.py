"""``draft_model``: a smaller model of the target's tokenizer guesses the next tokens.

``--speculative-config '{"method": "draft_model", "model": PATH, "num_speculative_tokens": k}'``
(or ``model`` without ``method``, as in vLLM). The draft is loaded in the worker next to
the target, with a paged KV cache of its own that uses the target's block ids: block ``b``
of the draft's cache holds the draft's keys and values of the very tokens block ``b`` of
the target's holds. After every step the draft runs the tokens the step made known, then
``k - 1`` more greedy decode steps batched over the speculating requests.

Invariants:
    * The draft's cache follows the target's, block for block: every token the target
      computes (prompt chunks, decoded tokens, accepted drafts, for every request,
      speculating or not, when prefix caching is on) the draft computes too, at the same
      slot, in the step that computed it. So a prefix-cache hit, a chunked prompt and a
      readmission after preemption find the draft's cache as filled as the target's, and
      no bookkeeping of its own is needed.
    * Positions past what the target holds (the request's newest token and the draft's
      own guesses) are written either in the request's own allocated blocks, beyond its
      computed tokens, or in scratch blocks of this step (``k`` positions at most, so
      ``ceil(k / block_size) + 1`` blocks per speculating request, taken out of the KV
      budget). Nothing there is read in a later step: the target computes those
      positions later, and the draft computes them again with it, overwriting them.
    * The draft's guesses are greedy (its argmax), so they are one-hot drafts for the
      rejection sampler; they never change what the user gets, only how fast.
    * The draft's vocabulary is the target's (same size; same tokens where both folders
      hold a ``tokenizer.json``): a draft token id means the same token to the target.
    * Importing this module imports no torch: the API server resolves the method name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from forkless.logger import init_logger
from forkless.spec_decode.config import SpeculativeConfig, check_draft_model
from forkless.spec_decode.interface import ProposalBatch, Proposer

if TYPE_CHECKING:
    import torch

    from forkless.worker.model_runner import ModelRunner

logger = init_logger(__name__)


class DraftModelProposer(Proposer):
    """A smaller model's greedy continuation (``"method": "draft_model"``).

    Args:
        config: The speculative configuration (``model``: the draft's folder).
        device: The worker's device.
        dtype: The target's dtype (the draft runs in it).
        runner: The worker's model runner (engine config, attention backend, cache dtype).
    """

    uses_kv_cache = True

    def __init__(self, config: SpeculativeConfig, *, device: "torch.device", dtype: "torch.dtype",
                 runner: "ModelRunner", **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        from forkless.distributed.parallel_state import replicated_model
        from forkless.model_loader import load_model
        from forkless.models.hf_config import load_hf_config
        from forkless.models.layers.cpu_linear import use_cpu_linear

        engine = runner.config
        assert config.model is not None  # SpeculativeConfig requires it for draft_model
        folder = check_draft_model(engine.model_config.model, config.model)
        self.device = device
        self.runner = runner
        self.hf_config = load_hf_config(folder)
        # Dummy target weights (benchmarks) mean dummy draft weights; else the folder's.
        load_format = "dummy" if engine.model_config.load_format == "dummy" else "auto"
        # With -tp N every rank holds the whole draft and guesses alike (from the same
        # tokens): vLLM's draft_tensor_parallel_size 1.
        with replicated_model():
            self.model = load_model(folder, self.hf_config, dtype, device, runner.attn_backend, load_format)
        use_cpu_linear(self.model, device, dtype)
        self.kv_spec = type(self.model).get_kv_cache_spec(self.hf_config)
        self.block_size = engine.cache_config.block_size
        self.max_model_len = engine.scheduler_config.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        # Scratch blocks per speculating request: its newest token and k - 1 guesses may
        # run k positions past the blocks the target holds for it (module invariants).
        self.scratch_per_row = -(-self.num_speculative_tokens // self.block_size) + 1
        self.scratch_rows = engine.scheduler_config.max_num_seqs
        self.num_blocks = 0
        self.kv_caches: list[torch.Tensor] = []
        # Without prefix caching, a request that never speculates never needs the
        # draft's cache: no other request reads its blocks.
        self.mirror_all = engine.cache_config.enable_prefix_caching
        logger.info("speculative decoding: draft model %s (%d layers), k = %d", folder, self.kv_spec.num_layers,
                    self.num_speculative_tokens)

    # ------------------------------------------------------------------ KV cache

    def _layer_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.kv_spec
        return self.runner.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, spec.num_kv_heads,
                                                           spec.head_dim)

    def kv_bytes_per_block(self) -> int:
        elems = int(np.prod(self._layer_shape(1)))
        return elems * self.runner.kv_cache_dtype.itemsize * self.kv_spec.num_layers

    def kv_reserved_bytes(self) -> int:
        return self.scratch_rows * self.scratch_per_row * self.kv_bytes_per_block()

    def initialize_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        shape = self._layer_shape(num_blocks + self.scratch_rows * self.scratch_per_row)
        self.kv_caches = [self.runner._zeros(shape) for _ in range(self.kv_spec.num_layers)]

    # ------------------------------------------------------------------- propose

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        import torch

        with torch.inference_mode():
            return self._propose(batch)

    def _propose(self, batch: ProposalBatch) -> list[list[int]]:
        import torch

        if not self.kv_caches:
            raise RuntimeError("the draft model's KV cache is not allocated: initialize_cache() was not called")
        rows = [row for row in batch.step or () if row.speculates or self.mirror_all]
        if not rows:
            return [[] for _ in batch.request_ids]
        k, bs = self.num_speculative_tokens, self.block_size
        row_of = {row.request_id: i for i, row in enumerate(rows)}
        # Batch order; past the scratch rows (never with the scheduler's max_num_seqs) no guess.
        proposing = np.fromiter((row_of[rid] for rid in batch.request_ids), dtype=np.int64,
                                count=len(batch.request_ids))[: self.scratch_rows]
        counts = np.fromiter((len(r.token_ids) for r in rows), dtype=np.int64, count=len(rows))
        starts = np.fromiter((r.start_position for r in rows), dtype=np.int64, count=len(rows))
        last = starts + counts - 1
        # Guesses worth making: the scheduler verifies none at or past max_model_len - 1.
        limit = np.clip(self.max_model_len - 2 - last[proposing], 0, k)
        # The farthest position each row writes: its last token, then its guesses but the last.
        reach = last.copy()
        reach[proposing] += np.maximum(limit - 1, 0)
        width = int(reach.max()) // bs + 1
        tables = np.zeros((len(rows), width), dtype=np.int64)
        scratch_of = np.full(len(rows), -1, dtype=np.int64)
        scratch_of[proposing] = np.arange(len(proposing))
        for i, row in enumerate(rows):
            need = int(reach[i]) // bs + 1
            own = row.block_ids[:need]
            tables[i, : len(own)] = own
            if len(own) < need:
                if scratch_of[i] < 0:
                    raise RuntimeError(f"request {row.request_id!r}: its {len(row.block_ids)} blocks do not "
                                       f"hold position {int(reach[i])}, which the step computed")
                first = self.num_blocks + int(scratch_of[i]) * self.scratch_per_row
                tables[i, len(own) : need] = np.arange(first, first + need - len(own))

        # One pass over every row's new tokens (the step's mirror, and each speculating
        # request's newest token), which gives the first guesses.
        total = int(counts.sum())
        ends = np.cumsum(counts)
        positions = np.repeat(starts - (ends - counts), counts) + np.arange(total)
        ids = np.fromiter((t for r in rows for t in r.token_ids), dtype=np.int64, count=total)
        hidden = self._forward(ids, positions, tables, np.repeat(np.arange(len(rows)), counts), counts,
                               starts + counts)
        out: list[list[int]] = [[] for _ in batch.request_ids]
        if not len(proposing):
            return out
        guesses = [self._argmax(hidden[torch.from_numpy(ends[proposing] - 1).to(self.device)])]
        members = [np.arange(len(proposing))]
        # Then k - 1 decode steps, batched over the requests that still want a guess.
        for step in range(1, k):
            alive = np.flatnonzero(limit > step)
            if not len(alive):
                break
            previous = guesses[-1][torch.from_numpy(np.searchsorted(members[-1], alive)).to(self.device)]
            pos = last[proposing[alive]] + step
            hidden = self._forward(previous, pos, tables[proposing[alive]], np.arange(len(alive)),
                                   np.ones(len(alive), dtype=np.int64), pos + 1)
            guesses.append(self._argmax(hidden))
            members.append(alive)
        for step, (tokens, alive) in enumerate(zip(guesses, members)):
            for token, n in zip(tokens.tolist(), alive.tolist()):
                if step < limit[n]:
                    out[n].append(token)
        return out

    def _argmax(self, hidden: "torch.Tensor") -> "torch.Tensor":
        from forkless.sample.argmax import row_argmax

        return row_argmax(self.model.compute_logits(hidden)[:, : self.vocab_size])

    def _forward(self, ids: Any, positions: np.ndarray, tables: np.ndarray, row_of_token: np.ndarray,
                 counts: np.ndarray, seq_lens: np.ndarray) -> "torch.Tensor":
        """One forward pass of the draft over ``ids`` (host array or device tensor)."""
        import torch

        from forkless.attention import AttentionMetadata

        bs = self.block_size
        slots = tables[row_of_token, positions // bs] * bs + positions % bs
        query_start = np.zeros(len(counts) + 1, dtype=np.int32)
        np.cumsum(counts, out=query_start[1:])
        seq_lens32 = seq_lens.astype(np.int32)
        dev = self.device
        md = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots.astype(np.int64)).to(dev),
            query_start_loc=torch.from_numpy(query_start).to(dev),
            seq_lens=torch.from_numpy(seq_lens32).to(dev),
            block_tables=torch.from_numpy(tables.astype(np.int32)).to(dev),
            max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens32.max()),
            block_size=bs,
            query_start_loc_cpu=torch.from_numpy(query_start),
            seq_lens_cpu=torch.from_numpy(seq_lens32),
        )
        ids_dev = ids if isinstance(ids, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(ids)).to(dev)
        return self.model(ids_dev, torch.from_numpy(positions.astype(np.int64)).to(dev), self.kv_caches, md)


__all__ = ["DraftModelProposer"]
