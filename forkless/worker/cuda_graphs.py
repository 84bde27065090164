"""CUDA graphs for decode steps: one graph per padded batch size, replayed every step.

A decode step of a small model is hundreds of tiny kernel launches; replaying a graph
turns them into one launch. The graphs read their inputs from static device buffers,
which each step fills with one non-blocking copy from a pinned host arena, so
the decode loop synchronises with the device only to read the sampled tokens.

With speculative decoding a second set of graphs runs *verification* steps: every row
holds ``q = 1 + k`` query tokens (its last known token and up to ``k`` drafts). A row with
fewer drafts is padded to ``q`` tokens that store nothing (slot -1) and whose outputs are
never read; its sequence length counts the padding, because the attention kernel places a
row's query tokens at the end of its sequence. Causality keeps the real tokens' outputs
independent of the padding behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from forkless.attention import AttentionMetadata
from forkless.logger import init_logger

if TYPE_CHECKING:
    from forkless.models.interface import CausalLMBase

logger = init_logger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Captured sizes: 1, 2, 4, 8, then every multiple of 16 up to ``max_num_seqs``.

    A batch runs in the smallest captured size that holds it, so padding wastes at most
    15 rows beyond 16.
    """
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += list(range(16, max_num_seqs + 1, 16))
    if sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def filler_metadata(num_tokens: int, max_model_len: int, block_size: int, device: torch.device,
                    slot_mapping: torch.Tensor | None = None) -> AttentionMetadata:
    """A prefill batch of ``num_tokens`` tokens in sequences of at most ``max_model_len``
    that stores nothing (the profiling run's and the piecewise warm-ups' batch).

    Args:
        num_tokens: Tokens in the batch.
        max_model_len: The longest sequence.
        block_size: Tokens per KV block.
        device: Where the metadata's tensors live.
        slot_mapping: ``[num_tokens]`` of -1 to use (a static buffer); ``None``: a new one.
    """
    lens = [min(max_model_len, num_tokens - i) for i in range(0, num_tokens, max_model_len)]
    starts = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=(torch.full((num_tokens,), -1, dtype=torch.int64, device=device)
                      if slot_mapping is None else slot_mapping),
        query_start_loc=starts.to(device),
        seq_lens=seq_lens.to(device),
        # Zeros: a kernel that reads the cache through them reads block 0, in bounds.
        block_tables=torch.zeros((len(lens), -(-max(lens) // block_size)), dtype=torch.int32, device=device),
        max_query_len=max(lens),
        max_seq_len=max(lens),
        block_size=block_size,
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )


def gather_block_rows(block_table: np.ndarray, table_rows: np.ndarray, out: np.ndarray) -> None:
    """Copy rows of the runner's block table into ``out`` (one C-level gather).

    Args:
        block_table: ``[R, W]`` int32, padded with 0.
        table_rows: ``[B]`` the rows to copy, in batch order.
        out: ``[B, W']`` int32. Columns past ``W`` (a table narrower than ``out``) are
            left as they are; columns past ``W'`` (one wider) are not copied: a decode
            within ``max_model_len`` reads only the first ``W'``.
    """
    if block_table.shape[1] == out.shape[1]:
        # mode="clip": the rows are valid, and "raise" would buffer the copy once more.
        np.take(block_table, table_rows, axis=0, out=out, mode="clip")
    else:
        width = min(block_table.shape[1], out.shape[1])
        out[:, :width] = block_table[table_rows, :width]


class DecodeGraphs:
    """Captures and replays the model's forward pass for pure-decode batches.

    Args:
        model: The model (its attention backend must be capturable).
        kv_caches: The per-layer caches the graphs write into.
        max_num_seqs: Largest batch to capture.
        max_blocks: Block-table width (``ceil(max_model_len / block_size)``).
        block_size: Tokens per KV block.
        device: The CUDA device.
        num_spec_tokens: ``k`` of speculative decoding: also capture verification graphs
            of ``1 + k`` tokens per row (0: none).
        max_spec_batch: Largest verification batch to capture.
    """

    def __init__(self, model: CausalLMBase, kv_caches: list[torch.Tensor], max_num_seqs: int,
                 max_blocks: int, block_size: int, device: torch.device, num_spec_tokens: int = 0,
                 max_spec_batch: int = 64) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        #: Captured batch sizes per query length (1: decode; 1 + k: verification).
        self.sizes_of: dict[int, list[int]] = {1: graph_batch_sizes(max_num_seqs)}
        if num_spec_tokens:
            self.sizes_of[1 + num_spec_tokens] = graph_batch_sizes(min(max_num_seqs, max_spec_batch))
        self.sizes = self.sizes_of[1]
        n = max(q * sizes[-1] for q, sizes in self.sizes_of.items())  # tokens
        rows = self.sizes[-1]
        self.max_blocks = max_blocks

        # Every per-step input lives at a fixed place of one pinned staging arena, which has
        # a twin on the device that the graphs read: a step's inputs cross in one copy, its
        # front up to the last block-table row in use (eight small copies before, each a
        # few microseconds of the device's time between two graphs at batch 1).
        fields = [("input_ids", n, torch.int64), ("positions", n, torch.int64),
                  ("slot_mapping", n, torch.int64), ("fix_where", n, torch.int64), ("fix_src", n, torch.int64),
                  ("seq_lens", rows, torch.int32), ("query_start_loc", rows + 1, torch.int32)]
        offsets, size = [], 0
        for _, count, dtype in fields:
            offsets.append(size)
            size += -(-count * dtype.itemsize // 8) * 8  # each field 8-byte aligned
        #: Bytes before the block tables: copied every step.
        self._front = size
        self._row_bytes = max_blocks * 4
        self._host = torch.zeros(size + rows * self._row_bytes, dtype=torch.uint8).pin_memory()
        self._dev = torch.zeros(size + rows * self._row_bytes, dtype=torch.uint8, device=device)

        def view(arena: torch.Tensor, offset: int, count: int, dtype: torch.dtype) -> torch.Tensor:
            return arena[offset : offset + count * dtype.itemsize].view(dtype)

        # (device view, pinned staging view) pairs; the graphs read only the device side.
        for (name, count, dtype), offset in zip(fields, offsets):
            setattr(self, name, (view(self._dev, offset, count, dtype), view(self._host, offset, count, dtype)))
        self.block_tables = (view(self._dev, size, rows * max_blocks, torch.int32).view(rows, max_blocks), None)
        # Pinned staging of the batch's block tables: each step gathers its rows from the
        # runner's persistent table (one C-level copy, no per-block Python work).
        self.block_staging = view(self._host, size, rows * max_blocks, torch.int32).view(rows, max_blocks)
        self._copied: torch.cuda.Event | None = None
        #: Graphs and their outputs by ``(query length, batch size)``.
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        #: Verification steps replayed (tests read it to tell graphs from eager runs).
        self.spec_replays = 0

    def max_batch(self, query_len: int = 1) -> int:
        """The largest batch a graph of ``query_len`` tokens per row can run (0: none)."""
        sizes = self.sizes_of.get(query_len)
        return sizes[-1] if sizes else 0

    def _metadata(self, q: int, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[0][: bs * q],
            query_start_loc=self.query_start_loc[0][: bs + 1],
            seq_lens=self.seq_lens[0][:bs],
            block_tables=self.block_tables[0][:bs],
            max_query_len=q,
            max_seq_len=self.max_blocks * self.block_size,
            block_size=self.block_size,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per (query length, size), most tokens first so that the
        smaller ones reuse its memory."""
        # Dummy batches: q tokens per sequence, nothing stored (slot -1).
        self.slot_mapping[0].fill_(-1)
        pool = None
        shapes = sorted(((q, bs) for q, sizes in self.sizes_of.items() for bs in sizes),
                        key=lambda qb: -qb[0] * qb[1])
        for q, bs in shapes:
            self.seq_lens[0].fill_(q)
            self.query_start_loc[0][: bs + 1].copy_(
                torch.arange(0, q * bs + 1, q, dtype=torch.int32, device=self.device))
            tokens = q * bs

            def args() -> tuple:
                # Fresh views and metadata each call: a layer that memoizes per positions
                # tensor (the rotary tables do), or a backend that caches what it derives
                # from the metadata in its backend_state, must not hand the capture the
                # warm-up's eager result, which would freeze it into the graph (stale, and
                # later freed, memory).
                return (self.input_ids[0][:tokens], self.positions[0][:tokens], self.kv_caches,
                        self._metadata(q, bs))

            self.model(*args())  # warm-up: compiles kernels, settles allocations
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[q, bs] = self.model(*args())
            pool = graph.pool()
            self.graphs[q, bs] = graph
        torch.cuda.synchronize(self.device)
        for q, sizes in self.sizes_of.items():
            logger.info("captured CUDA graphs for %s batch sizes %s", "decode" if q == 1 else
                        f"verification ({q} tokens a row)", sizes)

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray,
            seq_lens: np.ndarray, block_table: np.ndarray, table_rows: np.ndarray,
            ids_fix: tuple[np.ndarray, np.ndarray, torch.Tensor] | None = None, query_len: int = 1) -> torch.Tensor:
        """Replay the graph for this decode (or verification) batch.

        Args:
            input_ids: ``[B * q]`` each sequence's ``q`` tokens (``q`` = ``query_len``).
            positions: ``[B * q]`` their positions.
            slots: ``[B * q]`` their KV-cache slots (-1: padding, stores nothing).
            seq_lens: ``[B]`` lengths after this step (padding included).
            block_table: The runner's int32 block tables, one row per request it holds,
                padded with 0 (``ModelRunner.block_table``).
            table_rows: ``[B]`` each sequence's row of ``block_table``.
            ids_fix: ``(token indices, source rows, sampled)``: tokens that the previous
                step sampled and the host has not read, written over ``input_ids`` on the
                device after its copy (``input_ids[where] = sampled[src]``).
            query_len: Tokens per sequence: 1, or ``1 + k`` for verification.

        Returns:
            ``[B * q, hidden]`` final hidden states (a view of the graph's output: use it
            before the next replay).
        """
        q = query_len
        b = len(table_rows)
        bs = next(s for s in self.sizes_of[q] if s >= b)
        real, padded = b * q, bs * q
        if self._copied is not None:
            # The previous step's copy reads the pinned arena; with async scheduling the
            # host may get here before the device ran it (normally long done).
            self._copied.synchronize()
        self.input_ids[1][:real] = torch.from_numpy(input_ids)
        self.positions[1][:real] = torch.from_numpy(positions)
        # Padding rows still embed a token: make it a valid id, not whatever an earlier
        # step left there (a placeholder -1 under async scheduling).
        self.input_ids[1][real:padded] = 0
        self.positions[1][real:padded] = 0
        slot_host = self.slot_mapping[1].numpy()
        slot_host[:real] = slots
        slot_host[real:padded] = -1  # padding rows store nothing
        lens_host = self.seq_lens[1].numpy()
        lens_host[:b] = seq_lens
        lens_host[b:bs] = 0
        qsl = self.query_start_loc[1].numpy()
        qsl[: b + 1] = np.arange(0, real + 1, q)
        qsl[b + 1 : bs + 1] = real  # padding sequences own no token
        fixes = 0
        if ids_fix is not None:
            where, src, sampled = ids_fix
            fixes = len(where)
            self.fix_where[1].numpy()[:fixes] = where
            self.fix_src[1].numpy()[:fixes] = src
        gather_block_rows(block_table, table_rows, self.block_staging.numpy()[:b])
        # The arena's front and the batch's block-table rows, whole rows so that source
        # and destination stay contiguous: one DMA.
        nbytes = self._front + b * self._row_bytes
        self._dev[:nbytes].copy_(self._host[:nbytes], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        if fixes:
            tokens = sampled.index_select(0, self.fix_src[0][:fixes])
            self.input_ids[0].index_copy_(0, self.fix_where[0][:fixes], tokens)
        self.graphs[q, bs].replay()
        if q > 1:
            self.spec_replays += 1
        return self.outputs[q, bs][:real]
