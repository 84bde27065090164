"""CUDA graphs for decode steps: one graph per padded batch size, replayed every step.

A decode step of a small model is hundreds of tiny kernel launches; replaying a graph
turns them into one launch. The graphs read their inputs from static device buffers,
which each step fills with a handful of non-blocking copies from pinned host memory, so
the decode loop synchronises with the device only to read the sampled tokens.
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
    """

    def __init__(self, model: CausalLMBase, kv_caches: list[torch.Tensor], max_num_seqs: int,
                 max_blocks: int, block_size: int, device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sizes = graph_batch_sizes(max_num_seqs)
        n = self.sizes[-1]
        self.max_blocks = max_blocks

        def buf(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype).pin_memory()

        # (device buffer, pinned staging) pairs; the graphs read only the device side.
        self.input_ids = buf((n,), torch.int64)
        self.positions = buf((n,), torch.int64)
        self.slot_mapping = buf((n,), torch.int64)
        self.seq_lens = buf((n,), torch.int32)
        self.query_start_loc = buf((n + 1,), torch.int32)
        self.block_tables = (torch.zeros((n, max_blocks), dtype=torch.int32, device=device), None)
        # Pinned staging of the batch's block tables: each step gathers its rows from the
        # runner's persistent table (one C-level copy, no per-block Python work).
        self.block_staging = torch.zeros((n, max_blocks), dtype=torch.int32).pin_memory()
        self._copied: torch.cuda.Event | None = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def max_batch(self) -> int:
        """The largest batch a graph can run."""
        return self.sizes[-1]

    def _metadata(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[0][:bs],
            query_start_loc=self.query_start_loc[0][: bs + 1],
            seq_lens=self.seq_lens[0][:bs],
            block_tables=self.block_tables[0][:bs],
            max_query_len=1,
            max_seq_len=self.max_blocks * self.block_size,
            block_size=self.block_size,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per size, largest first so the smaller ones reuse its memory."""
        n = self.sizes[-1]
        # Dummy decode batch: one token per sequence, nothing stored (slot -1).
        self.slot_mapping[0].fill_(-1)
        self.seq_lens[0].fill_(1)
        self.query_start_loc[0].copy_(torch.arange(n + 1, dtype=torch.int32, device=self.device))
        pool = None
        for bs in reversed(self.sizes):
            md = self._metadata(bs)

            def args() -> tuple:
                # Fresh views each call: a layer that memoizes per positions tensor (the
                # rotary tables do) must not hand the capture the warm-up's eager result,
                # which would freeze it into the graph (stale, and later freed, memory).
                return self.input_ids[0][:bs], self.positions[0][:bs], self.kv_caches, md

            self.model(*args())  # warm-up: compiles kernels, settles allocations
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.model(*args())
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray,
            seq_lens: np.ndarray, block_table: np.ndarray, table_rows: np.ndarray,
            ids_fix: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Replay the graph for this decode batch.

        Args:
            input_ids: ``[B]`` the token each sequence decodes.
            positions: ``[B]`` its position.
            slots: ``[B]`` its KV-cache slot.
            seq_lens: ``[B]`` lengths after this step.
            block_table: The runner's int32 block tables, one row per request it holds,
                padded with 0 (``ModelRunner.block_table``).
            table_rows: ``[B]`` each sequence's row of ``block_table``.
            ids_fix: ``(rows, token ids)`` on the device, written over ``input_ids`` after
                its copy (tokens that the previous step sampled and the host has not read).

        Returns:
            ``[B, hidden]`` final hidden states (a view of the graph's output: use it
            before the next replay).
        """
        b = len(table_rows)
        bs = next(s for s in self.sizes if s >= b)
        if self._copied is not None:
            # The previous step's copies read these pinned buffers; with async scheduling
            # the host may get here before the device ran them (normally long done).
            self._copied.synchronize()
        self.input_ids[1][:b] = torch.from_numpy(input_ids)
        self.positions[1][:b] = torch.from_numpy(positions)
        # Padding rows still embed a token: make it a valid id, not whatever an earlier
        # step left there (a placeholder -1 under async scheduling).
        self.input_ids[1][b:bs] = 0
        self.positions[1][b:bs] = 0
        slot_host = self.slot_mapping[1].numpy()
        slot_host[:b] = slots
        slot_host[b:bs] = -1  # padding rows store nothing
        lens_host = self.seq_lens[1].numpy()
        lens_host[:b] = seq_lens
        lens_host[b:bs] = 0
        qsl = self.query_start_loc[1].numpy()
        qsl[: b + 1] = np.arange(b + 1)
        qsl[b + 1 : bs + 1] = b  # padding sequences own no token
        gather_block_rows(block_table, table_rows, self.block_staging.numpy()[:b])
        # Whole rows are copied so that source and destination stay contiguous (one DMA
        # of b * max_blocks ints).
        for dev, host in (self.input_ids, self.positions, self.slot_mapping, self.seq_lens):
            dev[:bs].copy_(host[:bs], non_blocking=True)
        self.query_start_loc[0][: bs + 1].copy_(self.query_start_loc[1][: bs + 1], non_blocking=True)
        self.block_tables[0][:b].copy_(self.block_staging[:b], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        if ids_fix is not None:
            self.input_ids[0].index_copy_(0, *ids_fix)
        self.graphs[bs].replay()
        return self.outputs[bs][:b]
