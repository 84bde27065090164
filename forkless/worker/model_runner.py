"""The model runner: turns a ``SchedulerOutput`` into one forward pass and sampled tokens.

It keeps a persistent ``InputBatch`` (one row per scheduled request, so logits processors
and seeded generators keep their state across steps) and the per-request state needed to
put a request back in the batch after a step in which it was not scheduled.

Block tables are kept here, not resent: each request the runner holds owns a row of the
persistent ``block_table`` array, filled from ``ScheduledRequest.new_block_ids`` (the
whole table at (re)admission, then the ids appended since) and freed when the request
finishes or is preempted. A step's ``block_tables`` is a gather of its requests' rows, so
its host work follows the blocks that changed, not every block of every request.

Prompt logprobs are computed from the hidden states of each prefill chunk as it runs,
kept per request until the prompt is done, and returned all at once with the request's
first sampled token. A request readmitted with outputs already returned them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from forkless import envs
from forkless.config import CUDAGRAPH_MODE_DEFAULT
from forkless.attention import AttentionBackend, AttentionMetadata
from forkless.distributed.parallel_state import get_pp_group, get_world_group
from forkless.logger import init_logger
from forkless.logits_processors import build_logits_processors
from forkless.model_loader import load_model, resolve_dtype
from forkless.models.hf_config import get_head_dim
from forkless.models.interface import CausalLMBase
from forkless.models.layers.cpu_linear import cpu_linear_name, use_cpu_linear
from forkless.models.layers.cuda_gemv import use_cuda_gemv
from forkless.ops.registry import using_custom_ops
from forkless.platforms.interface import AttentionSelectorConfig
from forkless.plugins import resolve_class
from forkless.protocol.step import PLACEHOLDER_TOKEN_ID, ModelRunnerOutput
from forkless.sample import InputBatch, LogprobsTensors, Sampler, gather_logprobs
from forkless.sampling_params import SamplingParams
from forkless.worker.cuda_graphs import filler_metadata
from forkless.worker.host_zeros import BlockPopulator, lazy_zeros
from forkless.worker.kv_budget import kv_cache_torch_dtype
from forkless.spec_decode.interface import StepRow
from forkless.structured_output.bitmask import StepBitmask
from forkless.worker.speculation import Verification, last_hidden_states, propose, speculates, verify

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.lora.layers import LoRAModelManager
    from forkless.protocol.lora import LoRARequest
    from forkless.protocol.step import ScheduledRequest, SchedulerOutput
    from forkless.sample.sampler import SamplerOutput
    from forkless.protocol.kv_transfer import KVConnectorOutput
    from forkless.spec_decode.interface import Proposer
    from forkless.worker.cuda_graphs import DecodeGraphs
    from forkless.worker.piecewise_graphs import PiecewiseGraphs
    from forkless.worker.kv_connector import WorkerKVConnector

logger = init_logger(__name__)

# Prompt positions whose logits are computed at once for prompt logprobs: bounds the
# [positions, vocab] float32 logits (256 x 152k is 156 MB) whatever the chunk size.
_PROMPT_LOGPROBS_SLICE = 256


def _tp_collectives_capturable() -> bool:
    """Whether this rank's TP communicator declares its collectives capturable in a CUDA graph."""
    from forkless.distributed.parallel_state import get_tp_group

    communicator = get_tp_group().communicator
    return communicator is None or communicator.supports_cuda_graphs


@dataclass
class _PromptPart:
    """Prompt logprobs of consecutive prompt positions, being copied to the host."""

    state: _RequestState
    first_position: int
    tensors: LogprobsTensors


@dataclass
class _PendingStep:
    """A launched step whose sampled tokens are still on the device."""

    rows: list[ScheduledRequest] = field(default_factory=list)
    out: SamplerOutput | None = None
    num_logprobs: list[int | None] | None = None
    # The sampled ids' host copy (pinned on CUDA) and the event that marks it complete.
    sampled_host: torch.Tensor | None = None
    ready: Any = None
    prompt_parts: list[_PromptPart] = field(default_factory=list)
    # Requests whose prompt logprobs are complete once this step's parts are in.
    prompt_done: list[tuple[str, _RequestState]] = field(default_factory=list)
    # Speculative decoding: this step's verified drafts, being copied to the host.
    verification: Verification | None = None
    # Each row's hidden state at its last scheduled position, for a proposer that reads them.
    last_hidden: torch.Tensor | None = None
    # With a KV connector: what its transfers did this step, and the requests whose loaded
    # blocks failed (the scheduler recomputes them: their tokens of this step are dropped).
    kv_connector_output: KVConnectorOutput | None = None
    kv_failed: set[str] = field(default_factory=set)
    # A step planned with defer_sampling, until sample_deferred(): (logits, sampler
    # metadata, the plan).
    deferred: tuple[torch.Tensor, Any, SchedulerOutput] | None = None


@dataclass
class _RequestState:
    params: SamplingParams
    prompt_token_ids: list[int]
    # The very list the input batch appends sampled tokens to.
    output_token_ids: list[int]
    # Its row of ModelRunner.block_table, and how many block ids that row holds.
    table_row: int = -1
    num_blocks: int = 0
    # While prompt logprobs are owed: one entry per prompt position 1.. (filled as the
    # prefill chunks run); None when not asked for or already returned.
    prompt_logprobs: list[Any] | None = None
    # Its LoRA adapter, None for the base model.
    lora: LoRARequest | None = None


def _history_slice(state: _RequestState, start: int, length: int) -> list[int]:
    """A request's tokens at positions ``start .. start + length - 1`` (prompt, then output)."""
    prompt = state.prompt_token_ids
    if start + length <= len(prompt):
        return prompt[start:start + length]
    head = prompt[start:]
    out_start = max(start - len(prompt), 0)
    return head + state.output_token_ids[out_start:out_start + length - len(head)]


class ModelRunner:
    """Owns the model, its KV cache and the sampling state of one worker.

    Args:
        config: The engine configuration.
        device: The worker's device.
    """

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        from forkless.models.hf_config import load_hf_config
        from forkless.platforms import current_platform

        self.config = config
        self.device = device
        mc = config.model_config
        self.hf_config = load_hf_config(mc.model)
        self.dtype = resolve_dtype(mc.dtype, self.hf_config, device)
        # The platform picks the backend (its default, or --attention-backend), so a
        # platform plugin can bring its own kernels without registering them. The call is
        # vLLM's, so that a platform ported from vLLM overrides it unchanged.
        cache_dtype = config.cache_config.cache_dtype
        selector = AttentionSelectorConfig(head_size=get_head_dim(self.hf_config), dtype=self.dtype,
                                           kv_cache_dtype=cache_dtype, block_size=config.cache_config.block_size)
        backend_path = current_platform.get_attn_backend_cls(
            config.device_config.attention_backend, attn_selector_config=selector,
            num_heads=int(self.hf_config.num_attention_heads))
        self.attn_backend = resolve_class(backend_path, AttentionBackend, "--attention-backend")
        #: What the KV cache holds: the model dtype, or float8 e4m3 (one byte per element).
        self.kv_cache_dtype = kv_cache_torch_dtype(cache_dtype, self.dtype, self.attn_backend, device)
        logger.info("platform %s (%s), attention backend %s (%s)", current_platform.name,
                    current_platform.get_device_name(device.index or 0), self.attn_backend.name or backend_path,
                    backend_path)
        # --compilation-config's custom_ops, for the ops the models build (else FORKLESS_CUSTOM_OPS).
        self._custom_ops = None if config.compilation_config is None else config.compilation_config.custom_ops
        with using_custom_ops(self._custom_ops):
            self.model = load_model(mc.model, self.hf_config, self.dtype, device, self.attn_backend,
                                    mc.load_format)
        self._use_cpu_kernels()
        gemv_layers = use_cuda_gemv(self.model, device, self.dtype, lora=config.lora_config is not None)
        if gemv_layers:
            logger.info("one-row products of %d linear layers run a Triton GEMV (FORKLESS_CUDA_GEMV=0: cuBLAS)",
                        gemv_layers)
        self.lora_manager: LoRAModelManager | None = None
        # Requests whose adapter failed to load: reported with the next collected step
        # (the engine core finishes them), and skipped until the core says they finished.
        self._lora_failed: dict[str, str] = {}
        self._lora_failed_ids: set[str] = set()
        if config.lora_config is not None:
            from forkless.lora.layers import LoRAModelManager

            lc = config.lora_config
            sc = config.scheduler_config
            self.lora_manager = LoRAModelManager(
                self.model, max_loras=lc.max_loras, max_lora_rank=lc.max_lora_rank,
                max_cpu_loras=lc.max_cpu_loras, dtype=self.dtype, device=device,
                max_tokens=max(sc.max_num_batched_tokens, sc.max_num_seqs))
        self.kv_spec = type(self.model).get_kv_cache_spec(self.hf_config)
        if config.parallel_config.world_size > 1 and isinstance(self.model, CausalLMBase):
            # Each rank caches only its KV heads, of its layers (an encoder caches nothing).
            self.kv_spec = self.kv_spec._replace(num_kv_heads=self.model.num_kv_heads,
                                                 num_layers=self.model.num_layers)
        self.block_size = config.cache_config.block_size
        self.kv_caches: list[torch.Tensor] = []
        # CPU: maps in the pages of blocks before their first write (initialize_cache).
        self._populator: BlockPopulator | None = None
        self.pin_memory = device.type == "cuda"
        processors = build_logits_processors(config, device, self.pin_memory, custom=config.logits_processors)
        self.input_batch = InputBatch(
            max_num_reqs=config.scheduler_config.max_num_seqs,
            vocab_size=mc.vocab_size,
            device=device,
            pin_memory=self.pin_memory,
            logits_processors=processors,
        )
        self.sampler = Sampler()
        self.proposer: Proposer | None = None
        if config.speculative_config is not None:
            from forkless.spec_decode.registry import ProposerRegistry

            spec = config.speculative_config
            with using_custom_ops(self._custom_ops):  # (a draft model builds ops too)
                self.proposer = ProposerRegistry.resolve(spec.method)(spec, device=device, dtype=self.dtype,
                                                                      target_model=self.model, runner=self)
        self.requests: dict[str, _RequestState] = {}
        # Row r holds the block table of the request whose table_row is r, in its first
        # num_blocks columns; the rest of the row is 0 (a kernel reading padding stays in
        # bounds). The runner holds at most max_num_seqs requests (the scheduler's running
        # set); rows and columns still grow on demand rather than fail.
        sched = config.scheduler_config
        self.block_table = np.zeros((sched.max_num_seqs, -(-sched.max_model_len // self.block_size)),
                                    dtype=np.int32)
        self._free_table_rows = list(range(sched.max_num_seqs - 1, -1, -1))
        self.use_cuda_graphs = (
            device.type == "cuda"
            and not config.device_config.enforce_eager
            and self.attn_backend.supports_cuda_graphs
            # The LoRA layers' Triton path keeps its per-step token grouping in persistent
            # buffers a graph reads; the torch path (no Triton) builds new tensors per step.
            and (self.lora_manager is None or self.lora_manager.supports_cuda_graphs)
            # With -tp > 1 a graph replays the layers' collectives: the communicator must allow it.
            and (config.parallel_config.tensor_parallel_size == 1 or _tp_collectives_capturable())
            # -pp > 1: a stage's send / recv run eagerly (not tried in graphs yet).
            and config.parallel_config.pipeline_parallel_size == 1
            # --compilation-config '{"cudagraph_mode": "NONE"}' is --enforce-eager's twin.
            and self._cudagraph_mode != "NONE"
        )
        # Pipeline parallelism: only the last stage computes logits and samples; the
        # others run their layers, pass the hidden states on and report nothing.
        pp = config.parallel_config.pipeline_parallel_size
        self.samples = pp == 1 or get_pp_group().is_last_rank
        self.graphs: DecodeGraphs | None = None
        # Prefill and mixed steps' graphs, split around attention (piecewise_graphs).
        self.piecewise: PiecewiseGraphs | None = None
        # The KV connector's worker side (--kv-transfer-config), made with the cache.
        self.kv_connector: WorkerKVConnector | None = None
        # The last launched step's sampled ids (device) and each request's row in it.
        self._prev_sampled: torch.Tensor | None = None
        self._prev_row_of: dict[str, int] = {}

    def _use_cpu_kernels(self) -> None:
        """On the CPU: let the model move its linear layers to weights packed at load, and
        with ``--quantization gguf`` onto the GGUF file's quantized blocks."""
        if use_cpu_linear(self.model, self.device, self.dtype):
            logger.info("linear layers run on weights packed for the CPU (%s)", cpu_linear_name(self.dtype))
        mc = self.config.model_config
        if mc.quantization == "gguf":
            from forkless.model_loader.gguf_quantized import use_gguf_matrices
            from forkless.models.layers.gguf_linear import GGUFLinear

            if not isinstance(self.model, CausalLMBase) or not self.model.supports_lora:
                raise ValueError(f"--quantization gguf: {type(self.model).__name__} does not name its projections "
                                 "(lora_modules), so its layers cannot take the GGUF blocks")
            count = use_gguf_matrices(self.model, mc.quantized_from)
            routes = {m.activations for m in self.model.modules() if isinstance(m, GGUFLinear)}
            if "int8" in routes:
                from forkless import cpu_kernels

                routes = {r + (f" ({cpu_kernels.load().forkless_quant_i8_route().decode()})" if r == "int8" else "")
                          for r in routes}
            logger.info("--quantization gguf: %d linear layers run on the Q8_0 / Q4_1 blocks of %s, activations %s "
                        "(FORKLESS_GGUF_ACTIVATIONS=%s)", count, mc.quantized_from, ", ".join(sorted(routes)),
                        envs.FORKLESS_GGUF_ACTIVATIONS)

    # ------------------------------------------------------------------ KV cache

    def _layer_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.kv_spec
        return self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block, all layers together (a draft model's cache included)."""
        elems = int(np.prod(self._layer_shape(1)))
        own = elems * self.kv_cache_dtype.itemsize * self.kv_spec.num_layers
        return own + (self.proposer.kv_bytes_per_block() if self.proposer is not None else 0)

    @property
    def kv_reserved_bytes(self) -> int:
        """KV-budget bytes taken before it is divided into blocks (a draft model's scratch)."""
        return self.proposer.kv_reserved_bytes() if self.proposer is not None else 0

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate one cache tensor per layer (zeroed: kernels may read padding)."""
        shape = self._layer_shape(num_blocks)
        self.kv_caches = [self._zeros(shape) for _ in range(self.kv_spec.num_layers)]
        if self.device.type == "cpu":
            # The lazily zeroed host cache: each step's new blocks are mapped in before it
            # writes them, in a few calls rather than a page fault per 4 KiB.
            populator = BlockPopulator(self.kv_caches, num_blocks)
            self._populator = populator if populator.active else None
        if self.proposer is not None:
            self.proposer.initialize_cache(num_blocks)
        if self.config.kv_transfer_config is not None:
            from forkless.worker.kv_connector import WorkerKVConnector

            self.kv_connector = WorkerKVConnector(self.config, self.model, self.kv_caches)
            if self.use_cuda_graphs and self.kv_connector.requires_layer_hooks_in_decode:
                logger.info("CUDA graphs are off: the KV connector's layer hooks run in every step")
                self.use_cuda_graphs = False
        if self.use_cuda_graphs:
            from forkless.worker.cuda_graphs import DecodeGraphs

            sched = self.config.scheduler_config
            # Verification graphs too, unless LoRA is on: its per-step token grouping
            # counts a row's real tokens, not the graph's padded ones.
            spec = self.config.speculative_config
            self.graphs = DecodeGraphs(
                self.model, self.kv_caches, sched.max_num_seqs,
                -(-sched.max_model_len // self.block_size), self.block_size, self.device,
                num_spec_tokens=spec.num_speculative_tokens if spec is not None and self.lora_manager is None else 0,
            )
            if self.lora_manager is not None:
                with self.lora_manager.capturing():
                    self.graphs.capture()
            else:
                self.graphs.capture()
            if self._piecewise_wanted():
                from forkless.worker.piecewise_graphs import PiecewiseGraphs

                piecewise = PiecewiseGraphs(self.model, self.kv_caches, sched.max_num_batched_tokens,
                                            sched.max_model_len, self.block_size, self.dtype, self.device)
                self.piecewise = piecewise if piecewise.capture() else None

    def release_cache(self) -> None:
        """Free the KV cache and the graphs captured on it (sleep mode);
        :meth:`initialize_cache` allocates it again, zeroed, and captures them again.

        Raises:
            RuntimeError: A KV connector or a draft model holds the cache (its hooks and
                its own cache are not rebuilt at wake-up).
        """
        if self.kv_connector is not None:
            raise RuntimeError("sleep mode with a KV connector (--kv-transfer-config) is not supported: "
                               "its layer hooks hold the cache")
        if self.proposer is not None and self.proposer.uses_kv_cache:
            raise RuntimeError("sleep mode with a draft model (--speculative-config) is not supported: "
                               "its own KV cache is not freed")
        self.graphs = self.piecewise = None
        self._populator = None
        self.kv_caches = []
        # The last step's sampled ids were read from a step on the freed cache.
        self._prev_sampled, self._prev_row_of = None, {}

    @property
    def _cudagraph_mode(self) -> str:
        comp = self.config.compilation_config
        return CUDAGRAPH_MODE_DEFAULT if comp is None else comp.cudagraph_mode

    def _piecewise_wanted(self) -> bool:
        """Whether prefill and mixed steps run as piecewise graphs (``cudagraph_mode``
        ``FULL_AND_PIECEWISE``, the default): the backend allows it, and nothing hooks the
        layers per step (LoRA's token grouping counts a step's real tokens; a KV
        connector's layer hooks would be skipped)."""
        return (self._cudagraph_mode == "FULL_AND_PIECEWISE" and self.attn_backend.supports_piecewise_graphs
                and self.lora_manager is None and self.kv_connector is None)

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
        # Zero pages on first touch: a multi-GiB cache costs nothing until used
        # (torch.zeros would memset it all up front); see host_zeros for the page size.
        nbytes = int(np.prod(shape)) * self.kv_cache_dtype.itemsize
        return torch.from_numpy(lazy_zeros(nbytes)).view(self.kv_cache_dtype).view(shape)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward pass at the step's token budget without a KV cache (peak activations)."""
        hidden, _ = self._profile_forward()
        sched = self.config.scheduler_config
        if self.samples:
            self.model.compute_logits(hidden[: min(sched.max_num_batched_tokens, sched.max_num_seqs)])

    def _profile_forward(self) -> tuple[torch.Tensor, np.ndarray]:
        """The model over ``max_num_batched_tokens`` tokens in sequences of ``max_model_len``.

        Returns:
            ``(hidden states, the sequences' cumulative token counts)``.
        """
        sched = self.config.scheduler_config
        total = sched.max_num_batched_tokens
        md = filler_metadata(total, sched.max_model_len, self.block_size, self.device)
        starts = md.query_start_loc_cpu.numpy()
        positions = torch.from_numpy(np.concatenate([np.arange(n) for n in md.seq_lens_cpu.tolist()])).to(self.device)
        input_ids = torch.zeros(total, dtype=torch.int64, device=self.device)
        if self.lora_manager is not None:
            self.lora_manager.clear_step()
        empty = [torch.empty(0, dtype=self.dtype, device=self.device)] * self.kv_spec.num_layers
        return self.model(input_ids, positions, empty, md), starts

    # -------------------------------------------------------------------- a step

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step.

        Args:
            scheduler_output: The scheduler's plan (see ``forkless.protocol.step``).

        Returns:
            One sampled token per request scheduled with ``sample``, and their logprobs
            as ``[token_ids, logprobs, sampled_rank]`` (sampled token first) for requests
            that asked for logprobs.
        """
        return self.collect(self.execute_model_async(scheduler_output))

    @property
    def supports_async_scheduling(self) -> bool:
        """Whether steps may be launched before the previous one's tokens are collected.

        A logits processor other than the built-in ones might read a request's output
        history, which lags by one step under async scheduling (the built-ins only do so
        for ``min_tokens``, ``bad_words`` and ``thinking_token_budget``, which the
        scheduler keeps out of async steps).
        """
        if self.config.parallel_config.pipeline_parallel_size > 1:
            return False  # the first stage never sees sampled tokens to fill placeholders with
        from forkless.logits_processors.registry import BUILTIN_LOGITS_PROCESSORS
        from forkless.plugins import import_path

        builtins = tuple(import_path(path) for path in BUILTIN_LOGITS_PROCESSORS)
        return all(type(p) in builtins for p in self.input_batch.logits_processors)

    @torch.inference_mode()
    def execute_model_async(self, scheduler_output: SchedulerOutput) -> _PendingStep:
        """Launch one step on the device without waiting for its sampled tokens.

        ``PLACEHOLDER_TOKEN_ID`` entries of the plan take the tokens sampled by the
        previous launched step, on the device. Pass the result to :meth:`collect`.
        """
        kv = self.kv_connector
        if kv is None:
            return self._launch(scheduler_output)
        # (Synchronous steps only, --kv-transfer-config refuses --async-scheduling: the
        # saves read the cache this step wrote.)
        kv.begin(scheduler_output)
        try:
            pending = self._launch(scheduler_output)
        finally:
            kv_output = kv.end(scheduler_output)
        pending.kv_connector_output = kv_output
        failed = np.zeros(len(pending.rows), dtype=np.float32)
        if kv_output.invalid_block_ids:
            bad = set(kv_output.invalid_block_ids)
            for i, s in enumerate(pending.rows):
                state = self.requests.get(s.request_id)
                if state is not None and not bad.isdisjoint(
                        self.block_table[state.table_row, : state.num_blocks].tolist()):
                    failed[i] = 1.0
        world = get_world_group()
        if world.world_size > 1:
            # Each rank loads its own part (heads, stage's layers): a block that failed on one
            # fails the request on all, so that the samplers drop the same tokens (every
            # rank, every step; with -pp the engine then runs one batch at a time).
            failed = world.all_reduce(torch.from_numpy(failed).to(self.device)).cpu().numpy()
        pending.kv_failed.update(s.request_id for s, bad_row in zip(pending.rows, failed) if bad_row)
        return pending

    def _launch(self, scheduler_output: SchedulerOutput) -> _PendingStep:
        self._update_states(scheduler_output)
        if scheduler_output.is_empty:
            return _PendingStep()
        if self._lora_failed_ids and not self.input_batch.req_id_to_index:
            return _PendingStep()  # every scheduled request's adapter failed to load
        metadata = self.input_batch.refresh()
        by_id = {s.request_id: s for s in scheduler_output.scheduled_requests}
        rows = [by_id[rid] for rid in self.input_batch.req_ids if rid is not None]
        prompt_parts: list[_PromptPart] = []
        verification: Verification | None = None
        # (is not None: the engine core's pinned buffer is a numpy array, which has no truth value)
        mask = scheduler_output.grammar_bitmask
        grammar = StepBitmask.from_plan(scheduler_output, rows) if mask is not None and len(mask) else None
        if self.lora_manager is not None:
            # Before a graph replay too: the graph reads the grouping from the buffers.
            requests = self.requests
            self.lora_manager.set_step([requests[s.request_id].lora for s in rows],
                                       np.fromiter((len(s.token_ids) for s in rows), dtype=np.int64,
                                                   count=len(rows)))
        if self._graph_fits(rows):
            # Every row decodes its last known token: no prompt position to score.
            hidden, last_idx = self._run_decode_graph(rows), None
            logits = self.model.compute_logits(hidden)
        elif self._verify_graph_fits(rows):
            hidden, starts, last_idx = self._run_verify_graph(rows)
            logits = self.model.compute_logits(hidden[last_idx])
            verification, _ = self._verify(rows, hidden, starts, grammar)
        else:
            input_ids, positions, attn_md, last_idx = self._prepare_inputs(rows)
            if self.piecewise is not None and input_ids.shape[0] <= self.piecewise.buckets[-1]:
                hidden = self.piecewise.run(input_ids, positions, attn_md)
            else:
                hidden = self.model(input_ids, positions, self.kv_caches, attn_md)
            if not self.samples:
                return _PendingStep(rows)  # an earlier pipeline stage: its hidden states went on
            prompt_parts = self._prompt_logprobs(rows, hidden, attn_md.query_start_loc_cpu)
            if not any(s.sample for s in rows):
                # Only prefill chunks that end mid-prompt.
                # (A draft model computes them too: the rows go to collect().)
                return _PendingStep(rows, ready=self._record() if prompt_parts else None, prompt_parts=prompt_parts)
            logits = None
            if any(s.num_spec_tokens for s in rows):
                # On the CPU one LM-head pass gives the sampled and the verified positions'
                # logits: each pass streams all of the head's weights.
                verification, logits = self._verify(rows, hidden, attn_md.query_start_loc_cpu, grammar,
                                                    last_idx if hidden.device.type == "cpu" else None)
            if logits is None:
                logits = self.model.compute_logits(hidden[last_idx])
        last_hidden = None
        if self.proposer is not None and self.proposer.needs_hidden_states:
            last_hidden = hidden if last_idx is None else hidden[last_idx]
        pending = _PendingStep(rows, prompt_parts=prompt_parts, verification=verification, last_hidden=last_hidden)
        if scheduler_output.defer_sampling:
            if verification is not None:
                raise RuntimeError("a step with drafts to verify cannot defer its sampling")
            # The forward is queued; the bitmask comes with sample_deferred().
            pending.deferred = (logits, metadata, scheduler_output)
            return pending
        return self._sample(pending, logits, metadata, grammar)

    @torch.inference_mode()
    def sample_deferred(self, pending: _PendingStep, grammar_bitmask: bytes | bytearray | None) -> None:
        """Sample a step launched with ``defer_sampling``, its constrained rows masked by
        ``grammar_bitmask`` (one row each, as ``SchedulerOutput.grammar_bitmask``; ``None``:
        none left to mask). Before the next step is launched: its placeholders read these
        tokens."""
        if pending.deferred is None:
            raise RuntimeError("sample_deferred() on a step that was not launched with defer_sampling, "
                               "or was sampled already")
        logits, metadata, plan = pending.deferred
        pending.deferred = None
        grammar = None
        if grammar_bitmask is not None:
            plan.grammar_bitmask = grammar_bitmask
            grammar = StepBitmask.from_plan(plan, pending.rows)
        self._sample(pending, logits, metadata, grammar)

    def _sample(self, pending: _PendingStep, logits: torch.Tensor, metadata: Any,
                grammar: StepBitmask | None) -> _PendingStep:
        """Sample a launched step's rows into ``pending`` and queue the tokens' copy."""
        rows = pending.rows
        if grammar is not None:
            # Structured outputs: one batched masking of the constrained rows' logits.
            grammar.apply_sampled(logits)
        out = self.sampler(logits, metadata)
        # Row order of this step: the next step's placeholders read their tokens here.
        self._prev_sampled = out.sampled_token_ids
        self._prev_row_of = {s.request_id: i for i, s in enumerate(rows)}
        # Queue the copy to the host now and wait for it alone in collect(): a plain
        # tolist() there would sync the whole stream, i.e. also wait for the step launched
        # after this one, which is exactly the overlap async scheduling is for.
        pending.out, pending.num_logprobs = out, metadata.num_logprobs
        pending.sampled_host = self._to_host(out.sampled_token_ids)
        requests = self.requests
        pending.prompt_done = [(s.request_id, state) for s in rows if s.sample
                               and (state := requests[s.request_id]).prompt_logprobs is not None]
        pending.ready = self._record()
        return pending

    def _to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Queue a device -> host copy (complete once the next ``_record()`` event is)."""
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin_memory)
        host.copy_(tensor, non_blocking=self.pin_memory)
        return host

    def _record(self) -> Any:
        """An event marking the copies queued so far (``None`` where copies are synchronous)."""
        if not self.pin_memory:
            return None
        ready = torch.cuda.Event()
        ready.record()
        return ready

    def _prompt_logprobs(self, rows: list[ScheduledRequest], hidden: torch.Tensor,
                         starts: torch.Tensor) -> list[_PromptPart]:
        """Score this step's prompt positions of the requests that owe prompt logprobs.

        Position ``p``'s logits give the logprobs of prompt token ``p + 1``, so the last
        prompt position has nothing to score. The values are the model's raw
        log-softmax, like vLLM's prompt logprobs.
        """
        parts: list[_PromptPart] = []
        requests = self.requests
        for i, s in enumerate(rows):
            state = requests[s.request_id]
            if state.prompt_logprobs is None:
                continue
            prompt = state.prompt_token_ids
            first = s.start_position
            count = min(first + len(s.token_ids), len(prompt) - 1) - first
            row_start = int(starts[i])
            num = state.params.prompt_logprobs
            assert num is not None
            for lo in range(0, count, _PROMPT_LOGPROBS_SLICE):
                hi = min(lo + _PROMPT_LOGPROBS_SLICE, count)
                logits = self.model.compute_logits(hidden[row_start + lo : row_start + hi])
                logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
                targets = self._to_device(np.asarray(prompt[first + lo + 1 : first + hi + 1], dtype=np.int64))
                t = gather_logprobs(logprobs, num, targets)
                host = LogprobsTensors(self._to_host(t.token_ids), self._to_host(t.logprobs),
                                       self._to_host(t.ranks))
                parts.append(_PromptPart(state, first + lo, host))
        return parts

    def step_done(self, pending: _PendingStep) -> bool:
        """Whether :meth:`collect` would return without waiting for the device (the step is
        sampled and its tokens' copy to the host has completed)."""
        return pending.deferred is None and (pending.ready is None or pending.ready.query())

    def collect(self, pending: _PendingStep) -> ModelRunnerOutput:
        """Wait for a launched step's sampled tokens and record them."""
        if pending.deferred is not None:
            raise RuntimeError("collect() before sample_deferred() on a step launched with defer_sampling")
        if pending.ready is not None:
            pending.ready.synchronize()  # the one device -> host wait of a step
        for part in pending.prompt_parts:
            owed = part.state.prompt_logprobs
            if owed is None:
                continue  # a recomputation after the values were returned
            t = part.tensors
            entries = zip(t.token_ids.tolist(), t.logprobs.tolist(), t.ranks.tolist())
            for offset, (ids, values, rank) in enumerate(entries):
                owed[part.first_position + offset] = [ids, values, rank]
        if pending.out is None:
            if pending.rows and self.proposer is not None and self.proposer.uses_kv_cache:
                self._propose(pending.rows, [[] for _ in pending.rows], ModelRunnerOutput(), pending)
            return self._lora_counts(ModelRunnerOutput(kv_connector_output=pending.kv_connector_output))
        rows, out = pending.rows, pending.out
        assert pending.sampled_host is not None
        sampled: list[list[int]] = [[t] for t in pending.sampled_host.tolist()]
        if pending.verification is not None:
            # A row with drafts emits the ones the target kept, then its own token.
            for i, tokens in pending.verification.emitted().items():
                sampled[i] = tokens
        requests = self.requests
        failed = pending.kv_failed
        for s, t in zip(rows, sampled):
            if s.sample and not (failed and s.request_id in failed):
                # The very list the input batch and the processors read. A request
                # finished or preempted since the launch is gone: its token is dropped,
                # as the scheduler drops it.
                state = requests.get(s.request_id)
                if state is not None:
                    state.output_token_ids.extend(t)
        result = ModelRunnerOutput(
            sampled_token_ids={s.request_id: t for s, t in zip(rows, sampled) if s.sample},
            kv_connector_output=pending.kv_connector_output,
        )
        if self.proposer is not None:
            self._propose(rows, sampled, result, pending)
        if out.logprobs is not None:
            per_row = out.logprobs.tolists(pending.num_logprobs)
            result.logprobs = {
                s.request_id: list(row) for s, row in zip(rows, per_row) if s.sample and row is not None
            }
        if pending.prompt_done:
            result.prompt_logprobs = {}
            for rid, state in pending.prompt_done:
                # None: an async step launched before this one was collected returned them.
                if state.prompt_logprobs is not None:
                    result.prompt_logprobs[rid] = state.prompt_logprobs
                    state.prompt_logprobs = None  # returned: a recomputation adds nothing
        if failed:
            # Sampled over KV that failed to load: dropped, here and in the scheduler.
            for per_request in (result.sampled_token_ids, result.logprobs, result.spec_token_ids):
                for rid in failed:
                    (per_request or {}).pop(rid, None)
        return self._lora_counts(result)

    def _verify(self, rows: list[ScheduledRequest], hidden: torch.Tensor, starts: torch.Tensor,
                grammar: StepBitmask | None,
                sampled: torch.Tensor | None = None) -> tuple[Verification, torch.Tensor | None]:
        """Queue the verification of this step's drafts (``starts``: each row's first
        token in ``hidden``, on the host; ``grammar``: the constrained rows' masks), and
        the logits at ``sampled`` from the same LM-head pass (``None`` without it)."""
        requests = self.requests
        return verify(rows, [requests[s.request_id].params for s in rows], hidden, starts,
                      self.model.compute_logits, self._to_device, self._to_host,
                      None if grammar is None else grammar.apply_verified, sampled)

    def _propose(self, rows: list[ScheduledRequest], sampled: list[list[int]], result: ModelRunnerOutput,
                 pending: _PendingStep) -> None:
        """Drafts for the next step of every request that may speculate (with this step's
        tokens in its history), and this step's verification counts."""
        proposer = self.proposer
        assert proposer is not None
        requests = self.requests
        spec_rows = [i for i, s in enumerate(rows)
                     if s.sample and (state := requests.get(s.request_id)) is not None and speculates(state.params)]
        histories = [(rows[i].request_id, (state := requests[rows[i].request_id]).prompt_token_ids,
                      state.output_token_ids) for i in spec_rows]
        hidden = None
        if proposer.needs_hidden_states and spec_rows and pending.last_hidden is not None:
            hidden = last_hidden_states(pending.last_hidden, pending.verification, spec_rows, self._to_device)
        step = self._step_rows(rows, sampled, set(spec_rows)) if proposer.uses_kv_cache else None
        result.spec_token_ids = propose(proposer, histories, self.input_batch.vocab_size, hidden, step,
                                        [rows[i].num_spec_tokens for i in spec_rows])
        if pending.verification is not None:
            result.spec_stats = pending.verification.stats(proposer.num_speculative_tokens)

    def _step_rows(self, rows: list[ScheduledRequest], sampled: list[list[int]], emitting: set[int]) -> list[StepRow]:
        """The step's rows for a proposer with a KV cache of its own: the tokens the target
        computed (rejected drafts left out), then, for the rows in ``emitting``, the
        tokens they emitted."""
        step = []
        requests = self.requests
        for i, s in enumerate(rows):
            state = requests.get(s.request_id)
            if state is None:
                continue
            tokens = s.token_ids[: len(s.token_ids) - s.num_spec_tokens]
            if PLACEHOLDER_TOKEN_ID in tokens:
                # An async step's input that the step before sampled: by now in the history.
                tokens = _history_slice(state, s.start_position, len(tokens))
            if i in emitting:
                tokens = tokens + sampled[i]
            step.append(StepRow(s.request_id, s.start_position, list(tokens),
                                self.block_table[state.table_row, : state.num_blocks], speculates(state.params)))
        return step

    def _lora_counts(self, output: ModelRunnerOutput) -> ModelRunnerOutput:
        """Add the LoRA manager's cumulative loads and evictions (for the metrics), and the
        requests whose adapter failed to load since the last collected step."""
        if self.lora_manager is not None:
            output.lora_loads = self.lora_manager.loads
            output.lora_evictions = self.lora_manager.evictions
            if self._lora_failed:
                output.failed_requests, self._lora_failed = self._lora_failed, {}
        return output

    def _load_lora(self, rid: str, lora: LoRARequest) -> bool:
        """Load a new request's adapter into the host cache; on failure fail that request alone.

        Returns:
            Whether it loaded; if not, the request is recorded as failed (with the reason,
            for the engine core) and the step runs without it.
        """
        assert self.lora_manager is not None
        try:
            self.lora_manager.add_adapter(lora)
        except Exception as exc:  # a bad adapter must not fail the step's other requests
            reason = f"LoRA adapter {lora.lora_name!r} (id {lora.lora_int_id}) failed to load: {exc}"
            logger.warning("request %r: %s", rid, reason)
            self._lora_failed[rid] = reason
            self._lora_failed_ids.add(rid)
            return False
        return True

    def _placeholder_sources(self, ids: np.ndarray, row_of_index: np.ndarray | None,
                             rows: list[ScheduledRequest]) -> tuple[np.ndarray, np.ndarray, torch.Tensor] | None:
        """Where ``ids`` holds placeholders: (their indexes, the rows of the previous step's
        sampled tokens that fill them, those tokens on the device)."""
        where = np.flatnonzero(ids == PLACEHOLDER_TOKEN_ID)
        if where.size == 0:
            return None
        prev_row_of = self._prev_row_of
        rows_of = where if row_of_index is None else row_of_index[where]
        try:
            src = np.fromiter((prev_row_of[rows[r].request_id] for r in rows_of.tolist()),
                              dtype=np.int64, count=where.size)
        except KeyError as e:
            raise RuntimeError(f"request {e.args[0]!r} has a placeholder token but was not "
                               "sampled by the previous step") from None
        assert self._prev_sampled is not None
        return where, src, self._prev_sampled

    def _placeholder_fix(self, ids: np.ndarray, row_of_index: np.ndarray | None,
                         rows: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where ``ids`` holds placeholders: (their indexes, the tokens), on the device."""
        sources = self._placeholder_sources(ids, row_of_index, rows)
        if sources is None:
            return None
        where, src, sampled = sources
        return self._to_device(where.astype(np.int64)), sampled.index_select(0, self._to_device(src))

    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for rid in (*so.finished_request_ids, *so.preempted_request_ids):
            state = self.requests.pop(rid, None)
            if state is not None:
                self._free_table_row(state)
            batch.remove_request(rid)
            self._lora_failed_ids.discard(rid)
        scheduled = {s.request_id for s in so.scheduled_requests}
        # Rows must be exactly this step's requests; unscheduled ones keep their state.
        for rid in [r for r in batch.req_id_to_index if r not in scheduled]:
            batch.remove_request(rid)
        failed_ids = self._lora_failed_ids
        populator = self._populator
        new_blocks: list[int] = []
        for s in so.scheduled_requests:
            rid = s.request_id
            if failed_ids and rid in failed_ids:
                continue  # its adapter failed to load: reported, and the core finishes it
            if s.is_new:
                if s.sampling_params is None:
                    raise RuntimeError(f"request {rid!r} is scheduled as new without its sampling_params")
                batch.remove_request(rid)
                if s.lora_request is not None and not self._load_lora(rid, s.lora_request):
                    old = self.requests.pop(rid, None)
                    if old is not None:
                        self._free_table_row(old)
                    continue
                params = s.sampling_params
                prompt = list(s.prompt_token_ids or ())
                # Readmitted with outputs: the prompt logprobs went out with the first one.
                owes_prompt_logprobs = params.prompt_logprobs is not None and not s.output_token_ids
                old = self.requests.get(rid)
                state = self.requests[rid] = _RequestState(
                    params,
                    prompt,
                    list(s.output_token_ids or ()),
                    prompt_logprobs=[None] * (len(prompt) - 1) if owes_prompt_logprobs else None,
                    lora=s.lora_request,
                )
                # Its table starts over from the whole one this entry carries.
                if old is not None:
                    self._free_table_row(old)
                self._take_table_row(state)
            else:
                state = self.requests.get(rid)
                if state is None:
                    raise RuntimeError(
                        f"request {rid!r} was scheduled as a running request but the model runner "
                        "never received it with is_new=True"
                    )
            if s.new_block_ids:
                self._append_blocks(state, s.new_block_ids)
                if populator is not None:
                    new_blocks.extend(s.new_block_ids)
            if state.num_blocks * self.block_size < s.start_position + len(s.token_ids):
                raise RuntimeError(
                    f"request {rid!r}: its block table holds {state.num_blocks} blocks, too few for "
                    f"{s.start_position + len(s.token_ids)} tokens (block ids lost between steps?)"
                )
            if rid not in batch.req_id_to_index:
                batch.add_request(rid, state.params, state.prompt_token_ids, state.output_token_ids)
        if new_blocks:
            assert populator is not None
            populator.populate(new_blocks)

    def _take_table_row(self, state: _RequestState) -> None:
        """Give a newly registered request an empty row of ``block_table``."""
        if not self._free_table_rows:
            # More requests than max_num_seqs held at once: the scheduler never runs that
            # many, but a wider batch is better served than refused.
            old = self.block_table
            self.block_table = np.zeros((2 * len(old), old.shape[1]), dtype=np.int32)
            self.block_table[: len(old)] = old
            self._free_table_rows = list(range(len(self.block_table) - 1, len(old) - 1, -1))
        state.table_row = self._free_table_rows.pop()
        state.num_blocks = 0

    def _free_table_row(self, state: _RequestState) -> None:
        """Return a dropped request's row, zeroed so the next owner's padding reads 0."""
        if state.table_row < 0:
            return
        self.block_table[state.table_row, : state.num_blocks] = 0
        self._free_table_rows.append(state.table_row)
        state.table_row = -1
        state.num_blocks = 0

    def _append_blocks(self, state: _RequestState, block_ids: list[int]) -> None:
        """Append block ids to a request's row of ``block_table``."""
        start = state.num_blocks
        end = start + len(block_ids)
        if end > self.block_table.shape[1]:
            # Wider than max_model_len allows: grow rather than corrupt a neighbour row.
            old = self.block_table
            self.block_table = np.zeros((len(old), max(end, 2 * old.shape[1])), dtype=np.int32)
            self.block_table[:, : old.shape[1]] = old
        self.block_table[state.table_row, start:end] = block_ids
        state.num_blocks = end

    def _table_rows(self, rows: list[ScheduledRequest]) -> np.ndarray:
        """Each row's index into ``block_table``."""
        requests = self.requests
        return np.fromiter((requests[s.request_id].table_row for s in rows), dtype=np.intp, count=len(rows))

    def _graph_fits(self, rows: list[ScheduledRequest]) -> bool:
        """A captured graph can run this step: every row decodes one sampled token."""
        return (
            self.graphs is not None
            and len(rows) <= self.graphs.max_batch()
            and all(len(s.token_ids) == 1 and s.sample for s in rows)
        )

    def _verify_graph_fits(self, rows: list[ScheduledRequest]) -> bool:
        """A verification graph can run this step: every row decodes its last token and
        its drafts (some have drafts), and the padded rows stay within ``max_model_len``."""
        if self.graphs is None or self.proposer is None:
            return False
        q = 1 + self.proposer.num_speculative_tokens
        limit = self.config.scheduler_config.max_model_len - q
        return (
            len(rows) <= self.graphs.max_batch(q)
            and any(s.num_spec_tokens for s in rows)
            and all(s.sample and len(s.token_ids) == 1 + s.num_spec_tokens and s.start_position <= limit
                    for s in rows)
        )

    def _run_verify_graph(self, rows: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run a verification batch in its graph, each row padded to ``q = 1 + k`` tokens.

        Returns:
            ``(hidden, starts, last_idx)``: the hidden states of the ``len(rows) * q``
            tokens, where each row starts in them (host) and each row's last real token
            (device).
        """
        assert self.graphs is not None and self.proposer is not None
        q = 1 + self.proposer.num_speculative_tokens
        n, bs = len(rows), self.block_size
        requests = self.requests
        ids = np.zeros((n, q), dtype=np.int64)
        counts = np.empty(n, dtype=np.int64)
        first = np.empty(n, dtype=np.int64)
        table_rows = np.empty(n, dtype=np.intp)
        for i, s in enumerate(rows):
            m = len(s.token_ids)
            ids[i, :m] = s.token_ids
            counts[i], first[i], table_rows[i] = m, s.start_position, requests[s.request_id].table_row
        positions = first[:, None] + np.arange(q)[None, :]
        slots = self.block_table[table_rows[:, None], positions // bs].astype(np.int64) * bs + positions % bs
        slots[np.arange(q)[None, :] >= counts[:, None]] = -1  # padding stores nothing
        starts = np.arange(0, n * q + 1, q, dtype=np.int32)
        flat_ids = ids.reshape(-1)
        hidden = self.graphs.run(flat_ids, positions.reshape(-1), slots.reshape(-1),
                                 (first + q).astype(np.int32), self.block_table, table_rows,
                                 self._placeholder_sources(flat_ids, np.repeat(np.arange(n), q), rows), query_len=q)
        return hidden, torch.from_numpy(starts), self._to_device(starts[:-1].astype(np.int64) + counts - 1)

    def _decode_inputs(
        self, rows: list[ScheduledRequest]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Host inputs of a pure-decode batch (one token per row), for the decode graphs.

        Returns:
            ``(input_ids, positions, slots, seq_lens, table_rows)``: per row its token,
            position, KV-cache slot, length after this step and row of ``block_table``.
        """
        bs = self.block_size
        n = len(rows)
        requests = self.requests
        # One pass over the rows (this runs for every request of every decode step).
        flat = np.array(
            [(s.token_ids[0], s.start_position, requests[s.request_id].table_row) for s in rows],
            dtype=np.int64,
        ).reshape(n, 3)
        positions = flat[:, 1].copy()
        table_rows = flat[:, 2].astype(np.intp)
        blocks = self.block_table[table_rows, positions // bs].astype(np.int64)
        return flat[:, 0].copy(), positions, blocks * bs + positions % bs, (positions + 1).astype(np.int32), table_rows

    def _run_decode_graph(self, rows: list[ScheduledRequest]) -> torch.Tensor:
        assert self.graphs is not None
        input_ids, positions, slots, seq_lens, table_rows = self._decode_inputs(rows)
        return self.graphs.run(
            input_ids,
            positions,
            slots,
            seq_lens,
            self.block_table,
            table_rows,
            self._placeholder_sources(input_ids, None, rows),
        )

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.pin_memory:
            # Pinned + non_blocking: the copy is queued, the host does not wait for the GPU.
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def _prepare_inputs(
        self, rows: list[ScheduledRequest]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        bs = self.block_size
        n = len(rows)
        requests = self.requests
        num_tokens = np.fromiter((len(s.token_ids) for s in rows), dtype=np.int64, count=n)
        first_positions = np.fromiter((s.start_position for s in rows), dtype=np.int64, count=n)
        table_rows = self._table_rows(rows)
        starts = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(num_tokens, out=starts[1:])
        total = int(starts[-1])
        row_of_token = np.repeat(np.arange(n), num_tokens)
        # Each token's position: its row's first position plus its offset in the row.
        positions = np.repeat(first_positions - starts[:-1], num_tokens) + np.arange(total)
        max_blocks = max(requests[s.request_id].num_blocks for s in rows)
        # A gather of the rows kept across steps; columns past a row's own blocks are 0,
        # so a kernel reading padding stays in bounds.
        block_tables = self.block_table[table_rows, :max_blocks]
        slots = block_tables[row_of_token, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = (first_positions + num_tokens).astype(np.int32)
        input_ids = np.fromiter((t for s in rows for t in s.token_ids), dtype=np.int64, count=int(starts[-1]))
        starts_t = torch.from_numpy(starts)
        seq_lens_t = torch.from_numpy(seq_lens)
        md = AttentionMetadata(
            slot_mapping=self._to_device(slots),
            query_start_loc=self._to_device(starts),
            seq_lens=self._to_device(seq_lens),
            block_tables=self._to_device(block_tables),
            max_query_len=int(num_tokens.max()),
            max_seq_len=int(seq_lens.max()),
            block_size=bs,
            query_start_loc_cpu=starts_t,
            seq_lens_cpu=seq_lens_t,
        )
        last_idx = self._to_device(starts[1:].astype(np.int64) - 1)
        input_ids_dev = self._to_device(input_ids)
        fix = self._placeholder_fix(input_ids, row_of_token, rows)
        if fix is not None:
            input_ids_dev.index_copy_(0, *fix)
        return input_ids_dev, self._to_device(positions), md, last_idx
