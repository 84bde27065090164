"""The model runner of ``--runner pooling``: one forward pass per step, pooled, no sampling.

Invariants:
    * Every scheduled request is a pooling request whose whole prompt is in this step
      (the scheduler never chunks one), so its hidden states are all here: the runner
      pools them and returns ``ModelRunnerOutput.pooler_output``; the request finishes.
    * Requests keep a block-table row for the step (a causal model writes its KV there;
      an encoder ignores the cache); the row is freed when the scheduler reports the
      request finished.
    * No sampler, logits processors, CUDA graphs or async steps: there is no decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from forkless.pooling.interface import SupportsPooling
from forkless.pooling.poolers import pool_step
from forkless.pooling_params import PoolingParams
from forkless.protocol.step import ModelRunnerOutput
from forkless.worker.model_runner import ModelRunner, _RequestState

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.protocol.step import SchedulerOutput


class PoolingModelRunner(ModelRunner):
    """Runs pooling requests (embeddings, classification, scores).

    Args:
        config: The engine configuration (``model_config.pooler_config`` set).
        device: The worker's device.
    """

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        super().__init__(config, device)
        pooler = config.model_config.pooler_config
        if pooler is None:
            raise ValueError("PoolingModelRunner needs model_config.pooler_config (--runner pooling)")
        self.pooler_config = pooler
        self.use_cuda_graphs = False  # graphs capture decode steps; pooling has none
        self._params: dict[str, PoolingParams] = {}
        model = self.model
        self._token_types = isinstance(model, SupportsPooling) and model.takes_token_type_ids
        if pooler.num_labels and not (isinstance(model, SupportsPooling) and model.num_labels):
            raise ValueError(f"{type(model).__name__} has no classifier head, but the model is served for "
                             f"{pooler.task}")

    @property
    def supports_async_scheduling(self) -> bool:
        """No: a pooling step has no token for the next step to wait on."""
        return False

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward pass at the step's token budget (peak activations), pooled."""
        hidden, starts = self._profile_forward()
        pool_step(self.model, hidden, starts, [PoolingParams() for _ in starts[1:]], self.pooler_config)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and pool every request in it."""
        so = scheduler_output
        for rid in (*so.finished_request_ids, *so.preempted_request_ids):
            state = self.requests.pop(rid, None)
            if state is not None:
                self._free_table_row(state)
            self._params.pop(rid, None)
        rows = so.scheduled_requests
        for s in rows:
            rid = s.request_id
            if not s.is_new or s.pooling_params is None or s.sampling_params is None:
                raise RuntimeError(f"request {rid!r} reached the pooling runner without its pooling "
                                   "parameters in one step (pooling requests run whole, once)")
            old = self.requests.pop(rid, None)
            if old is not None:
                self._free_table_row(old)
            state = self.requests[rid] = _RequestState(s.sampling_params, list(s.prompt_token_ids or ()), [])
            self._take_table_row(state)
            self._append_blocks(state, s.new_block_ids)
            self._params[rid] = s.pooling_params
        if not rows:
            return ModelRunnerOutput()
        input_ids, positions, md, _ = self._prepare_inputs(rows)
        kwargs = {}
        if self._token_types:
            types = [s.pooling_params.token_type_ids or [0] * len(s.token_ids) for s in rows]  # type: ignore[union-attr]
            kwargs["token_type_ids"] = self._to_device(np.fromiter(
                (t for row in types for t in row), dtype=np.int64, count=len(input_ids)))
        hidden = self.model(input_ids, positions, self.kv_caches, md, **kwargs)
        assert md.query_start_loc_cpu is not None
        params = [self._params[s.request_id] for s in rows]
        pooled = pool_step(self.model, hidden, md.query_start_loc_cpu.numpy(), params, self.pooler_config)
        return ModelRunnerOutput(pooler_output={s.request_id: p for s, p in zip(rows, pooled)})

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:  # type: ignore[override]
        """Pooling steps are synchronous: the result itself is the handle."""
        return self.execute_model(scheduler_output)

    def step_done(self, pending: ModelRunnerOutput) -> bool:  # type: ignore[override]
        return True  # execute_model_async ran the step

    def collect(self, pending: ModelRunnerOutput) -> ModelRunnerOutput:  # type: ignore[override]
        return pending
