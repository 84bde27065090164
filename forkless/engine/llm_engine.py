"""The synchronous engine: processor + in-process ``EngineCore`` + output processor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from forkless.protocol.step import FinishReason
from forkless.engine.core import EngineCore
from forkless.engine.main_guard import check_not_bootstrapping
from forkless.engine.output_processor import OutputProcessor
from forkless.engine.processor import Processor
from forkless.executor import get_executor_cls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from forkless.config import EngineArgs, EngineConfig, ModelConfig
    from forkless.protocol.lora import LoRARequest
    from forkless.core.sched import SchedulerStats
    from forkless.engine.processor import PromptType
    from forkless.outputs import RequestOutput
    from forkless.pooling_params import PoolingParams
    from forkless.sampling_params import SamplingParams


class LLMEngine:
    """Runs requests to completion in the caller's thread (used by ``LLM``).

    Args:
        config: The engine configuration.
        log_stats: Give every ``RequestOutput`` its request's statistics
            (``metrics``, a :class:`forkless.metrics.stats.RequestStateStats`), as
            vLLM's ``LLMEngine(log_stats=True)``; off, ``metrics`` is ``None``.

    Raises:
        ValueError, ImportError, TypeError: ``distributed_executor_backend`` names no
            registered executor, does not import, or is not an ``Executor`` subclass.
    """

    def __init__(self, config: EngineConfig, log_stats: bool = False) -> None:
        check_not_bootstrapping("LLM() / LLMEngine()")
        # Resolved first, before the tokenizer loads and the executor starts workers: a
        # bad --distributed-executor-backend fails at once (create_engine_config checked
        # the other class paths).
        get_executor_cls(config.parallel_config.distributed_executor_backend)
        self.config = config
        self.processor = Processor(config)
        self.log_stats = log_stats
        self.output_processor = OutputProcessor(self.processor.tokenizer, log_stats=log_stats,
                                                stream_interval=config.scheduler_config.stream_interval)
        self.processor.reasoning_token_ids  # noqa: B018 (a --reasoning-config that fails fails here)
        self.engine_core = EngineCore(config, log_stats=log_stats)
        # The other requests' outputs of a step that raised for failed requests, returned
        # by the next step() (see step()).
        self._held: list[RequestOutput] = []

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        """Resolve the arguments and build the engine (with per-request statistics unless
        ``disable_log_stats``, as vLLM's)."""
        return cls(engine_args.create_engine_config(), log_stats=not engine_args.disable_log_stats)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer."""
        return self.processor.tokenizer

    # vLLM's LLMEngine attributes, which scripts read through ``llm.llm_engine``
    # (``llm.llm_engine.model_config.max_model_len``): other names of what is above.

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (vLLM's name of :meth:`get_tokenizer`)."""
        return self.processor.tokenizer

    @property
    def vllm_config(self) -> EngineConfig:
        """The whole configuration (vLLM's name of :attr:`config`)."""
        return self.config

    @property
    def model_config(self) -> ModelConfig:
        """The model's configuration (``config.model_config``)."""
        return self.config.model_config

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        *,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Validate, tokenize and queue a request (with ``lora_request``: on that adapter).

        Raises:
            ValueError: Invalid prompt or parameters (see :meth:`Processor.process_inputs`).
        """
        processed = self.processor.process_inputs(
            request_id, prompt, params, arrival_time=arrival_time, priority=priority,
            lora_request=lora_request,
        )
        self.output_processor.add_request(processed)
        added: list[str] = []
        try:
            for core_request in processed.core_requests:
                self.engine_core.add_request(core_request)
                added.append(core_request.request_id)
        except BaseException:
            self.output_processor.abort_requests([request_id])
            self.engine_core.abort_requests(added)
            raise

    def add_pooling_request(self, request_id: str, prompt: PromptType, pooling_params: PoolingParams | None = None,
                            *, priority: int = 0) -> None:
        """Validate, tokenize and queue a pooling request (embedding, classification, score).

        Raises:
            ValueError: Invalid input (see :meth:`Processor.process_pooling_inputs`).
        """
        processed = self.processor.process_pooling_inputs(request_id, prompt, pooling_params, priority=priority)
        self.output_processor.add_request(processed)
        try:
            self.engine_core.add_request(processed.core_requests[0])
        except BaseException:
            self.output_processor.abort_requests([request_id])
            raise

    def step(self) -> list[RequestOutput]:
        """Run one engine step.

        Returns:
            Outputs of requests with news (finished ones have ``finished=True``).

        Raises:
            ValueError: Some requests could not be run (a worker could not load their
                LoRA adapter, the engine core could not compile their grammar); those are
                finished, the others stay in flight. What the step gave the others comes
                with the next call, which runs no step for it: nothing is lost.
            RuntimeError: The same, for requests that failed in the engine (their KV
                cache failed to load under ``kv_load_failure_policy: fail``).
        """
        if self._held:
            held, self._held = self._held, []
            return held
        core_outputs = self.engine_core.step()
        processed = self.output_processor.process_outputs(core_outputs.outputs, core_outputs.timestamp,
                                                          core_outputs.monotonic_timestamp)
        if processed.reqs_to_abort:
            self.engine_core.abort_requests(processed.reqs_to_abort, FinishReason.STOP)
        # Requests the engine could not run (their LoRA adapter failed to load: refused,
        # ValueError) or that failed in it (a KV load under kv_load_failure_policy "fail":
        # RuntimeError): finished in the engine core already, the other requests go on.
        # Offline there is no per-request error channel, so the step fails with the reasons.
        for take, error in ((self.engine_core.take_request_failures, RuntimeError),
                            (self.engine_core.take_request_errors, ValueError)):
            pairs = take()
            if pairs:
                self.output_processor.abort_requests([rid for rid, _ in pairs])
                failed = {rid for rid, _ in pairs}
                self._held = [out for out in processed.request_outputs if out.request_id not in failed]
                raise error("; ".join(f"request {rid!r}: {reason}" for rid, reason in pairs))
        return processed.request_outputs

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """Cancel requests (user-visible ids); unknown ids are ignored."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        self.engine_core.abort_requests(self.output_processor.abort_requests(request_ids))

    def has_unfinished_requests(self) -> bool:
        """Whether any request is still in flight (or has outputs that step() holds)."""
        return bool(self._held) or self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        """Number of user-visible requests in flight."""
        return self.output_processor.get_num_unfinished_requests()

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Run a worker method on every worker; the results by rank (see ``LLM.collective_rpc``)."""
        return self.engine_core.collective_rpc(method, timeout, args, kwargs)

    def sleep(self, level: int = 1) -> None:
        """Free the workers' KV cache (level 2: their weights too); see ``LLM.sleep``."""
        self.engine_core.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Allocate again what :meth:`sleep` freed; see ``LLM.wake_up``."""
        self.engine_core.wake_up(tags)

    def is_sleeping(self) -> bool:
        """Whether the engine sleeps."""
        return self.engine_core.is_sleeping()

    def make_stats(self) -> SchedulerStats:
        """The engine core's scheduler statistics."""
        return self.engine_core.make_stats()

    def shutdown(self) -> None:
        """Stop the workers."""
        self.engine_core.shutdown()
