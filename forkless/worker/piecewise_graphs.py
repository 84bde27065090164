"""Piecewise CUDA graphs for prefill and mixed steps.

A decode step is captured whole (``cuda_graphs.DecodeGraphs``). A step with prompt tokens
cannot be: its attention launches grids sized by its prompts. But the launches between two
attention calls (the projections, norms, rotary embedding with the KV store, SiLU) depend
only on the number of tokens, and at thousands of tokens a layer's ~9 of them cost the host
longer to launch from Python than the GPU takes to run them (benchmarks/README.md). Those
stretches are captured once per padded token count (a *bucket*); a step copies its tokens
into static buffers, then replays piece 0, runs layer 0's attention eagerly, replays piece 1,
and so on: per layer one graph replay and one attention launch. vLLM's
``cudagraph_mode=FULL_AND_PIECEWISE`` splits its graphs around attention the same way.

The split: while a bucket is captured, ``forkless.attention.piecewise`` holds this object as
the splitter, and the attention backend (``supports_piecewise_graphs``) hands each
``forward_stored`` call to :meth:`PiecewiseGraphs.split`, which ends the graph being
captured, notes the call, and starts the next graph.

Invariants:
    * A bucket's pieces replay in order, one step at a time, with only its attention calls
      between them; all buckets share one memory pool (captured largest first), so a
      tensor that one piece leaves for the next lives at the address the capture gave it.
    * Attention reads its queries from one static buffer and writes into another, shared
      by every layer and bucket (views of their first rows): the last op of each piece
      copies the layer's queries there.
    * Padding tokens (the step's tokens up to its bucket) store nothing (slot -1); their
      rows are computed and never read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from forkless.attention import AttentionBackend, AttentionMetadata, attention_layers
from forkless.attention.piecewise import splitting
from forkless.logger import init_logger
from forkless.worker.cuda_graphs import filler_metadata

if TYPE_CHECKING:
    from forkless.models.interface import CausalLMBase

logger = init_logger(__name__)

#: An attention call between two pieces: the backend, its layer's cache, and the query and
#: output buffers it reads and writes.
_Call = tuple[AttentionBackend, torch.Tensor, torch.Tensor, torch.Tensor]

#: Steps below this many tokens run in the smallest bucket (a kernel at 64 rows costs
#: about what it costs at 1; the decode graphs take pure-decode steps anyway).
_MIN_BUCKET = 64


def piecewise_buckets(max_tokens: int) -> list[int]:
    """The captured token counts: 64, 128, then powers of two and 1.5x powers of two up to
    ``max_tokens`` (which is one), so that a step pads by at most half of itself.

    Args:
        max_tokens: The largest step (``--max-num-batched-tokens``).
    """
    sizes, size = [], _MIN_BUCKET
    while size < max_tokens:
        sizes.append(size)
        if size >= 256 and size * 3 // 2 < max_tokens:
            sizes.append(size * 3 // 2)
        size *= 2
    return sizes + [max(max_tokens, _MIN_BUCKET)]


class PiecewiseGraphs:
    """Captures a model's forward pass in pieces split at attention, per token bucket.

    Args:
        model: The model; its attention backend declares ``supports_piecewise_graphs``.
        kv_caches: The per-layer caches attention reads (the pieces store into them).
        max_tokens: The largest step (``--max-num-batched-tokens``).
        max_model_len: The longest sequence (the warm-up's sequences are no longer).
        block_size: Tokens per KV block.
        dtype: The model's activation dtype (its queries').
        device: The CUDA device.
    """

    def __init__(self, model: CausalLMBase, kv_caches: list[torch.Tensor], max_tokens: int,
                 max_model_len: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buckets = piecewise_buckets(max_tokens)
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        n = self.buckets[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        # The attention calls' query and output buffers, by (heads, head size), allocated
        # before any capture (one pair serves every layer of that shape).
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        layers = attention_layers(model)
        self._num_attention = len(layers)
        for _, backend in layers:
            shape = (n, backend.num_heads, backend.head_dim)
            if shape[1:] not in self._buffers:
                self._buffers[shape[1:]] = (torch.empty(shape, dtype=dtype, device=device),
                                            torch.zeros(shape, dtype=dtype, device=device))
        self._pool = torch.cuda.graph_pool_handle()
        #: Per bucket: its graphs (one more than attention calls) and the calls between them.
        self.pieces: dict[int, tuple[list[torch.cuda.CUDAGraph], list[_Call]]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        #: Steps replayed (tests read it to tell these graphs from eager steps).
        self.replays = 0
        # During a capture: the graph being captured, the finished ones, the calls noted.
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._calls: list[_Call] = []

    def bucket(self, num_tokens: int) -> int | None:
        """The bucket a step of ``num_tokens`` tokens runs in (``None``: too large)."""
        for size in self.buckets:
            if size >= num_tokens:
                return size
        return None

    @torch.inference_mode()
    def capture(self) -> bool:
        """Capture every bucket, largest first (the smaller ones reuse its memory).

        Returns:
            Whether the forward pass split at every attention layer. ``False`` (nothing is
            kept): a model that attends other than through its backends' ``forward_stored``
            (a plugin's) would have its attention frozen into a piece, so it runs eagerly.
        """
        stream = torch.cuda.Stream(self.device)
        for size in reversed(self.buckets):
            md = filler_metadata(size, self.max_model_len, self.block_size, self.device, self.slot_mapping[:size])
            # Fresh views each call (see DecodeGraphs.capture: the rotary tables memoize
            # per positions tensor). The warm-up compiles this size's kernels.
            self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, md)
            torch.cuda.synchronize(self.device)
            # As torch.cuda.graph does before a capture: the warm-up's cached blocks go back
            # to the device, so the pool's copy of the same activations does not stack on them.
            torch.cuda.empty_cache()
            self._graphs, self._calls = [], []
            with torch.cuda.stream(stream), splitting(self):
                self._graph = torch.cuda.CUDAGraph()
                self._graph.capture_begin(pool=self._pool)
                try:
                    hidden = self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, md)
                finally:
                    self._graph.capture_end()
            self._graphs.append(self._graph)
            self._graph = None
            if len(self._calls) != self._num_attention:
                logger.warning("prefill and mixed steps run eagerly: the model's forward pass made %d attention "
                               "calls through its backends' forward_stored, for %d attention layers",
                               len(self._calls), self._num_attention)
                self.pieces.clear()
                self.outputs.clear()
                return False
            self.pieces[size] = (self._graphs, self._calls)
            self.outputs[size] = hidden
        torch.cuda.synchronize(self.device)
        logger.info("captured piecewise CUDA graphs for prefill and mixed steps of %s tokens (%d pieces each)",
                    self.buckets, len(self.pieces[self.buckets[-1]][0]))
        return True

    def split(self, backend: AttentionBackend, q: torch.Tensor, kv_cache: torch.Tensor,
              attn_metadata: AttentionMetadata) -> torch.Tensor:
        """End the piece before an attention call and start the next (the splitter)."""
        assert self._graph is not None, "split() outside a capture"
        n = q.shape[0]
        q_buf, out_buf = self._buffers[q.shape[1], q.shape[2]]
        q_buf[:n].copy_(q)  # the piece's last op: the queries where the call reads them
        self._graph.capture_end()
        self._graphs.append(self._graph)
        self._calls.append((backend, kv_cache, q_buf, out_buf))
        self._graph = torch.cuda.CUDAGraph()
        self._graph.capture_begin(pool=self._pool)
        return out_buf[:n].view(n, -1)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """Run a prefill or mixed step through its bucket's pieces.

        Args:
            input_ids: ``[T]`` the step's tokens (on the device).
            positions: ``[T]`` their positions.
            attn_metadata: The step's metadata (``T`` slots); attention reads it as it is.

        Returns:
            ``[T, hidden]`` final hidden states (a view of the bucket's output: use it
            before the next step runs).
        """
        n = input_ids.shape[0]
        size = self.bucket(n)
        assert size is not None, f"a step of {n} tokens has no bucket (largest {self.buckets[-1]})"
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(attn_metadata.slot_mapping)
        if size > n:
            self.slot_mapping[n:size].fill_(-1)
        graphs, calls = self.pieces[size]
        graphs[0].replay()
        for (backend, cache, q_buf, out_buf), graph in zip(calls, graphs[1:]):
            backend.forward_stored(q_buf[:size], cache, attn_metadata, output=out_buf[:size])
            graph.replay()
        self.replays += 1
        return self.outputs[size][:n]

