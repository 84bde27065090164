"""The engine core: scheduler + executor, stepped in a loop.

It runs in-process under ``LLMEngine`` and in its own process under the server; either
way it only sees ``EngineCoreRequest`` in and ``EngineCoreOutputs`` out.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import msgspec

from forkless import envs
from forkless.core.request import Request, RequestStatus
from forkless.protocol.step import EngineCoreEvent, EngineCoreEventType, FinishReason, SpecDecodeStats
from forkless.core.sched import KVCacheConfig, get_scheduler_cls
from forkless.protocol.engine import EngineCoreOutputs, check_pause_mode
from forkless.executor import get_executor_cls
from forkless.logger import init_logger
from forkless.metrics.step_trace import StepTrace
from forkless.structured_output.config import StructuredOutputsConfig
from forkless.structured_output.manager import StructuredOutputManager
from forkless.structured_output.process import GrammarProcessClient

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.core.sched import SchedulerStats
    from forkless.executor.interface import Executor
    from forkless.protocol.step import SchedulerOutput
    from forkless.protocol.engine import EngineCoreRequest
    from forkless.protocol.lora import LoRARequest

logger = init_logger(__name__)


class EngineSleepingError(RuntimeError):
    """A request came while the engine sleeps (:meth:`EngineCore.sleep`) unpaused (an
    offline ``LLM``, which cannot wait for a wake-up): refused alone, the engine going on."""


class EngineCore:
    """Owns the scheduler and the executor (and through it the workers).

    Construction loads general plugins, starts the executor (which loads the model),
    sizes the KV cache, and builds the scheduler from ``--scheduler-cls``.

    Args:
        config: The engine configuration. ``config.cache_config.num_blocks`` is set to
            the number of KV-cache blocks the workers allocated.
        log_stats: Record each request's lifecycle events (queued, scheduled,
            preempted; ``EngineCoreOutput.events``) for per-request statistics, as
            vLLM's engine core does with ``log_stats``. Off, nothing is recorded.

    Raises:
        ValueError: The KV cache cannot hold one ``max_model_len`` sequence, or a class
            path in the config is invalid.
    """

    def __init__(self, config: EngineConfig, log_stats: bool = False) -> None:
        from forkless.plugins import load_general_plugins

        load_general_plugins()
        self.config = config
        self.log_stats = log_stats
        # With log_stats: each request's events not sent yet; they go with its next output.
        self._events: dict[str, list[EngineCoreEvent]] = {}
        # FORKLESS_STEP_TRACE_DIR: one record per async step (forkless.metrics.step_trace);
        # _collect adds its waiting and updating times to the step's record.
        self._trace = StepTrace.open("core")
        self._trace_wait = self._trace_update = self._trace_mask = 0.0
        # Sleep mode (sleep / wake_up): what the workers have freed.
        self._sleeping: set[str] = set()
        # vLLM's pause (pause / resume; AsyncLLM.pause_generation and sleep): None, "new"
        # (nothing new is admitted; what the scheduler holds runs on) or "all" (nothing
        # is stepped). Requests that arrive meanwhile wait here, in arrival order, with
        # their adapter, and go to the scheduler on resume().
        self._paused: str | None = None
        self._pause_held: dict[str, tuple[Request, LoRARequest | None]] = {}
        self.executor = get_executor_cls(config.parallel_config.distributed_executor_backend)(config)
        try:
            num_blocks = self.executor.determine_num_blocks()
            self.executor.initialize_cache(num_blocks)
            config.cache_config.num_blocks = num_blocks
            kv_cache_config = KVCacheConfig(
                num_blocks=num_blocks,
                block_size=config.cache_config.block_size,
                enable_prefix_caching=config.cache_config.enable_prefix_caching,
                prefix_caching_hash_algo=config.cache_config.prefix_caching_hash_algo,
            )
            scheduler_cls = get_scheduler_cls(config.scheduler_cls)
            self.scheduler = scheduler_cls(config.scheduler_config, kv_cache_config)
            # The KV connector's scheduler side (its worker side is in each worker).
            self._connector: Any = None  # a forkless.kv_transfer.KVConnectorBase
            if config.kv_transfer_config is not None:
                if not scheduler_cls.supports_kv_connector:
                    raise ValueError(f"--kv-transfer-config: the scheduler {scheduler_cls.__qualname__} does not host "
                                     "KV connectors (supports_kv_connector is False)")
                from forkless.kv_transfer import KVConnectorFactory, KVConnectorRole

                self._connector = KVConnectorFactory.create_connector(config, KVConnectorRole.SCHEDULER,
                                                                      kv_cache_config)
                self.scheduler.set_kv_connector(self._connector)
            # Pipeline parallelism: one batch in flight per stage (micro-batches), each
            # planned from requests whose tokens are all known; it takes the place of
            # async scheduling, whose placeholders the first stage could not fill (only
            # the last stage samples).
            self._max_batches = self.executor.max_concurrent_batches
            if self._max_batches > 1 and self._connector is not None:
                # A block that failed to load on any stage must fail its request on the last
                # stage before it samples: the ranks agree on it step by step (a collective
                # of every rank), which would hold each stage to the others anyway.
                logger.info("--kv-transfer-config with %d pipeline stages: one batch at a time", self._max_batches)
                self._max_batches = 1
            if self._max_batches > 1 and not self.scheduler.supports_concurrent_batches:
                logger.warning("the scheduler %s does not plan concurrent batches: the %d pipeline stages run "
                               "one batch at a time", scheduler_cls.__qualname__, self._max_batches)
                self._max_batches = 1
            if self._max_batches > 1:
                self.scheduler.set_max_concurrent_batches(self._max_batches)
            # The launched batches not collected yet, oldest first: (plan, handle).
            self._batches: deque[tuple[SchedulerOutput, Any]] = deque()
            # Async scheduling needs a runner that can launch without waiting and a
            # scheduler that tracks tokens in flight; otherwise the flag is a no-op.
            self.async_scheduling = (
                config.scheduler_config.async_scheduling
                and self._max_batches == 1
                and self.executor.supports_async_scheduling
                and self.scheduler.supports_async_scheduling
            )
            if config.scheduler_config.async_scheduling and self._max_batches > 1:
                logger.info("--async-scheduling with --pipeline-parallel-size %d: the stages overlap %d "
                            "micro-batches instead", self._max_batches, self._max_batches)
            elif config.scheduler_config.async_scheduling and not self.async_scheduling:
                logger.warning("--async-scheduling is not supported by this executor, worker or "
                               "scheduler (or a custom logits processor is loaded): stepping synchronously")
            # The launched step whose tokens are not collected yet: (plan, handle); and
            # whether it was launched with defer_sampling and waits for its bitmask
            # (_sample_pending).
            self._pending: tuple[SchedulerOutput, Any] | None = None
            self._unsampled = False
            # The adapter of each request the scheduler holds that has one: the scheduler
            # does not know adapters, so the plan's admissions get theirs here
            # (_attach_loras), and at most --max-loras adapters are in the scheduler at
            # once (so no step can need more slots than the workers have): a request for
            # another adapter is held here, in arrival order, until one of them is done.
            self._lora_of: dict[str, LoRARequest] = {}
            # The same requests' objects, whose status the scheduler keeps (for the stats).
            self._lora_requests: dict[str, Request] = {}
            self._lora_count: Counter[int] = Counter()
            self._lora_held: deque[tuple[Request, LoRARequest]] = deque()
            # Adapter ids whose weights a load_inplace request replaced and the workers have
            # not reread yet: the next admission of a request with the id carries the
            # reload (_attach_loras) -- not the load_inplace request itself, which may be
            # aborted before it runs, nor every later admission of it (a preempted request
            # readmitted would read the folder again, maybe an older checkpoint's).
            self._lora_reload: set[int] = set()
            # Speculative decoding's counters so far (None without it).
            self._spec_stats = SpecDecodeStats() if config.speculative_config is not None else None
            # The workers' cumulative adapter loads and evictions, as last reported.
            self._lora_loads = self._lora_evictions = 0
            # (request id, reason) of requests a worker could not run (their adapter failed
            # to load), finished here; the caller tells their clients (take_request_errors).
            self._request_errors: list[tuple[str, str]] = []
            # ... and of requests that failed on the server's side (a KV load under
            # kv_load_failure_policy "fail"): their clients get a server error
            # (take_request_failures).
            self._request_failures: list[tuple[str, str]] = []
            # Structured outputs: constrained requests wait here, with their adapter, while
            # their grammar compiles on the manager's threads (forkless.structured_output).
            self._structured = _structured_output_manager(config, self.executor)
            self._grammar_held: dict[str, tuple[Request, LoRARequest | None]] = {}
            # Under async scheduling, a step planned while the one before still runs
            # leaves its constrained rows' bitmask for later: the grammars take the
            # step before's tokens, and fill it, while the device runs the new step's
            # forward (SchedulerOutput.defer_sampling). Needs an executor that can.
            self._defer_grammar = self.async_scheduling and self.executor.supports_deferred_sampling
            self.scheduler.set_grammar_deferred(self._defer_grammar)
        except BaseException:
            self.executor.shutdown()
            raise

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request.

        Raises:
            ValueError: It can never be served (empty prompt, prompt of ``max_model_len``
                tokens or more, duplicate id), or it names a LoRA adapter and the engine
                was started without ``--enable-lora``.
            EngineSleepingError: The engine sleeps (:meth:`sleep`) and is not paused
                (paused, the request waits for :meth:`resume`).
        """
        if self._sleeping and self._paused is None:
            raise EngineSleepingError(f"request {request.request_id!r}: the engine sleeps "
                                      f"({', '.join(sorted(self._sleeping))}): call wake_up() first")
        salt: Any = request.cache_salt
        lora = request.lora_request
        if lora is not None:
            if self.config.lora_config is None:
                raise ValueError(f"request {request.request_id!r} names LoRA adapter {lora.lora_name!r} but "
                                 "the engine was started without --enable-lora (enable_lora=True)")
            # An adapter changes every block's KV: two adapters (or an adapter and the
            # base model) must never share prefix-cache blocks.
            salt = ("lora", lora.lora_int_id, lora.lora_name, request.cache_salt)
            if lora.load_inplace:
                self._lora_reload.add(lora.lora_int_id)
                lora = msgspec.structs.replace(lora, load_inplace=False)
        core_request = Request(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id,
            arrival_time=request.arrival_time,
            priority=request.priority,
            cache_salt=salt,
            group_id=request.group_id,
            client_key=request.client_key,
            pooling_params=request.pooling_params,
        )
        so = request.sampling_params.structured_outputs if request.sampling_params is not None else None
        if so is not None:
            if request.request_id in self._grammar_held:
                raise ValueError(f"duplicate request id {request.request_id!r}")
            # Into the scheduler once its grammar is compiled (_admit_compiled).
            self._grammar_held[request.request_id] = (core_request, lora)
            self._structured.submit(request.request_id, so, request.prompt_token_ids)
        else:
            self._queue(core_request, lora)
        if self.log_stats:
            # Once taken (a refused request has no events): a request whose grammar
            # compiles first, or that waits for a LoRA slot, counts as queued all along.
            self._events[request.request_id] = [EngineCoreEvent(EngineCoreEventType.QUEUED, time.monotonic())]

    def _queue(self, core_request: Request, lora: LoRARequest | None) -> None:
        """Hand a request to the scheduler (or hold it for an adapter slot, or until
        :meth:`resume` while paused)."""
        if self._paused is not None:
            if core_request.request_id in self._pause_held:
                raise ValueError(f"duplicate request id {core_request.request_id!r}")
            self._pause_held[core_request.request_id] = (core_request, lora)
            return
        if lora is None:
            self.scheduler.add_request(core_request)
            return
        if self._lora_held or not self._lora_fits(lora):
            if any(r.request_id == core_request.request_id for r, _ in self._lora_held):
                raise ValueError(f"duplicate request id {core_request.request_id!r}")
            self._lora_held.append((core_request, lora))
            return
        self._admit_lora(core_request, lora)

    def _lora_fits(self, lora: LoRARequest) -> bool:
        assert self.config.lora_config is not None
        return lora.lora_int_id in self._lora_count or len(self._lora_count) < self.config.lora_config.max_loras

    def _admit_lora(self, request: Request, lora: LoRARequest) -> None:
        self.scheduler.add_request(request)
        self._lora_of[request.request_id] = lora
        self._lora_requests[request.request_id] = request
        self._lora_count[lora.lora_int_id] += 1

    def _lora_done(self, request_ids: Iterable[str]) -> None:
        """Requests left the scheduler: free their adapters' places, admit what now fits."""
        freed = False
        for rid in request_ids:
            lora = self._lora_of.pop(rid, None)
            self._lora_requests.pop(rid, None)
            if lora is not None:
                self._lora_count[lora.lora_int_id] -= 1
                if not self._lora_count[lora.lora_int_id]:
                    del self._lora_count[lora.lora_int_id]
                    freed = True
        # In arrival order; a request whose adapter still does not fit waits, and so do
        # the ones behind it (no overtaking, as in the scheduler's own queue).
        while freed and self._lora_held and self._lora_fits(self._lora_held[0][1]):
            self._admit_lora(*self._lora_held.popleft())

    def _attach_loras(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        """Give the plan's admissions their adapters."""
        lora_of = self._lora_of
        if lora_of:
            reload = self._lora_reload
            for s in scheduler_output.scheduled_requests:
                if s.is_new:
                    lora = lora_of.get(s.request_id)
                    if reload and lora is not None and lora.lora_int_id in reload:
                        reload.discard(lora.lora_int_id)
                        lora = msgspec.structs.replace(lora, load_inplace=True)
                    s.lora_request = lora
        return scheduler_output

    def _note_worker_output(self, runner_output: Any) -> Any:
        """Keep what the workers report besides tokens -- speculative decoding's counts, LoRA
        loads and evictions -- for the stats, and finish the requests a worker could not run
        (before the output is applied, which then skips them)."""
        if runner_output.spec_stats is not None and self._spec_stats is not None:
            self._spec_stats.add(runner_output.spec_stats)
        if runner_output.lora_loads:
            self._lora_loads = runner_output.lora_loads
            self._lora_evictions = runner_output.lora_evictions
        failed = runner_output.failed_requests
        if failed:
            ids = list(failed)
            self.scheduler.finish_requests(ids, FinishReason.ABORT)
            self._forget_failed(ids)
            self._request_errors.extend(failed.items())
        return runner_output

    def _forget_failed(self, ids: list[str]) -> None:
        """Drop the grammars and adapter counts of requests the scheduler has finished as
        failed (they have no last output to do it)."""
        self._structured.finish(ids)
        if self._lora_of:
            self._lora_done(ids)

    def take_request_failures(self) -> list[tuple[str, str]]:
        """``(request id, reason)`` of the requests that failed on the server's side since
        the last call (the scheduler ended them: ``take_failed_requests``); they are
        finished already. Their clients get a server error (HTTP 500), not a refusal."""
        failures, self._request_failures = self._request_failures, []
        return self._without_events(failures)

    def take_request_errors(self) -> list[tuple[str, str]]:
        """``(request id, reason)`` of the requests failed since the last call (a worker could
        not run them: their LoRA adapter failed to load); they are finished already."""
        errors, self._request_errors = self._request_errors, []
        return self._without_events(errors)

    def _without_events(self, taken: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``taken`` (failed requests, handed to their callers), their recorded events dropped."""
        if self._events:
            for rid, _ in taken:
                self._events.pop(rid, None)
        return taken

    def _admit_compiled(self) -> None:
        """Queue the constrained requests whose grammar is ready; fail those whose
        constraint did not compile (their clients get the reason)."""
        ready, failed = self._structured.poll()
        for rid in ready:
            held = self._grammar_held.pop(rid, None)
            if held is not None:
                try:
                    self._queue(*held)
                except ValueError as exc:
                    self._structured.finish([rid])
                    self._request_errors.append((rid, str(exc)))
        for rid, reason in failed:
            if self._grammar_held.pop(rid, None) is not None:
                self._request_errors.append((rid, reason))

    def _plan(self, in_flight: bool = False) -> SchedulerOutput:
        """The scheduler's next step, with its admissions' adapters and the constrained
        requests' grammar bitmask (left for :meth:`_sample_deferred` when a step is
        ``in_flight``: the grammars have not taken its tokens yet)."""
        scheduler_output = self._attach_loras(self.scheduler.schedule())
        if self.log_stats:
            self._record_plan(scheduler_output)
        if in_flight and self._defer_grammar:
            self._structured.defer(scheduler_output)
        else:
            self._structured.fill_bitmask(scheduler_output)
        return scheduler_output

    def _record_plan(self, plan: SchedulerOutput) -> None:
        """Note the plan's admissions (first or after a preemption) and its preemptions."""
        now = time.monotonic()
        events = self._events
        for s in plan.scheduled_requests:
            if s.is_new:
                events.setdefault(s.request_id, []).append(EngineCoreEvent(EngineCoreEventType.SCHEDULED, now))
        for rid in plan.preempted_request_ids:
            events.setdefault(rid, []).append(EngineCoreEvent(EngineCoreEventType.PREEMPTED, now))

    def _outputs(self, outputs: list) -> EngineCoreOutputs:
        """A step's ``EngineCoreOutputs``: its outputs, with their requests' events, and the stats."""
        events = self._events
        if events:
            for out in outputs:
                if out.request_id in events:
                    out.events = events.pop(out.request_id)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats(), timestamp=time.time(),
                                 monotonic_timestamp=time.monotonic())

    def _sample_pending(self) -> None:
        """Let the workers sample the pending step, launched with ``defer_sampling``, with
        the bitmask its fill thread made (started by :meth:`_step_async` once the grammars
        held the tokens of the step before): before anything is launched after it, or it
        is collected."""
        if self._unsampled:
            self._unsampled = False
            assert self._pending is not None
            t0 = self._trace.now() if self._trace is not None else 0.0
            bitmask = self._structured.take_deferred_fill()
            if self._trace is not None:
                self._trace_mask += self._trace.now() - t0
            if not self._structured.sample_sent:  # (else the grammar process told the workers)
                self.executor.sample_deferred(self._pending[1], bitmask)

    def _finished(self, outputs: list, defer_advance: bool = False) -> list:
        failures = self.scheduler.take_failed_requests()
        if failures:
            self._forget_failed([rid for rid, _ in failures])
            self._request_failures.extend(failures)
        if self._structured.has_grammars():
            # Advance the grammars (with defer_advance, on the fill thread started next,
            # where the backend allows); one that is complete finishes its request
            # ("stop"), even where the model's EOS would not (ignore_eos).
            complete, rejected = self._structured.accept(outputs, defer_advance)
            if complete or rejected:
                done = set(complete)
                self.scheduler.finish_requests(complete + [rid for rid, _ in rejected], FinishReason.STOP)
                self._request_errors.extend(rejected)
                for out in outputs:
                    if out.request_id in done:
                        out.finish_reason = FinishReason.STOP
        if self._lora_of:
            self._lora_done([o.request_id for o in outputs if o.finish_reason is not None])
        return outputs

    def abort_requests(self, request_ids: Iterable[str], finish_reason: FinishReason = FinishReason.ABORT) -> None:
        """Finish requests now (client gone, stop string hit). Unknown ids are ignored."""
        ids = list(request_ids)
        for held in (self._grammar_held, self._pause_held):
            if held:
                for rid in ids:
                    held.pop(rid, None)
        self._structured.finish(ids)
        if self._lora_held:
            gone = set(ids)
            self._lora_held = deque(held for held in self._lora_held if held[0].request_id not in gone)
        self.scheduler.finish_requests(ids, finish_reason)
        if self._lora_of:
            self._lora_done(ids)
        if self._events:
            for rid in ids:
                self._events.pop(rid, None)

    def step(self) -> EngineCoreOutputs:
        """Schedule, execute and update once.

        Returns:
            The step's outputs (empty, with stats, when there is nothing to run).
        """
        if self._grammar_held:
            self._admit_compiled()
            if (self._grammar_held and not self.scheduler.has_unfinished_requests() and self._pending is None
                    and not self._batches):
                # Only grammars to wait for: sleep on them rather than spin (the compile
                # threads need the core), a little at a time so that new requests and
                # aborts are still read.
                self._structured.wait(0.05)
                self._admit_compiled()
        if self._paused == "all":
            return self._outputs(self._collect_launched())
        if self._max_batches > 1:
            return self._step_batches()
        if self.async_scheduling:
            return self._step_async()
        if not self.scheduler.has_unfinished_requests():
            return self._outputs([])
        scheduler_output = self._plan()
        runner_output = self._note_worker_output(self.executor.execute_model(scheduler_output))
        outputs = self._finished(self.scheduler.update_from_output(scheduler_output, runner_output))
        if self._connector is not None and scheduler_output.is_empty:
            # Only a KV connector's transfers are in flight: let its threads have the CPU
            # rather than spin on empty steps.
            time.sleep(0.001)
        return self._outputs(outputs)

    def _step_async(self) -> EngineCoreOutputs:
        # Schedule and launch step N+1, then collect step N: the host's scheduling and
        # input preparation of N+1 run while the device computes N, and N+1 is queued
        # behind N so the device never waits for the host. Tokens of N reach N+1 on the
        # device (placeholders). The outputs returned are step N's.
        #
        # Structured outputs: N+1 is planned with defer_sampling (its bitmask needs N's
        # tokens). Once N is collected (the grammars have taken its tokens), N+1's
        # bitmask is filled on the grammar manager's fill thread, while this thread
        # returns N's outputs and, in the next call, plans N+2; N+1 is sampled with it
        # just before N+2 is launched (_sample_pending), and so before N+2's
        # placeholders read its tokens. (A grammar process with a route to the workers
        # tells them to sample N+1 itself, as soon as the bitmask is written; the step
        # loop then only waits for the fill's reply there.)
        outputs: list = []
        trace = self._trace
        started = scheduled = launched_at = trace.now() if trace is not None else 0.0
        pending = self._pending
        if pending is not None and not self.scheduler.can_schedule_async():
            # A request that reads its latest tokens is waiting: finish N before
            # scheduling more.
            outputs = self._collect_pending()[0]
            pending = None
        launched = None
        if self.scheduler.has_unfinished_requests():
            scheduler_output = self._plan(in_flight=pending is not None)
            scheduled = trace.now() if trace is not None else 0.0
            if not self._structured.sample_sent:
                self._sample_pending()
            # (else the grammar process tells the workers to sample N, and they do before
            # they launch N+1: the fill is waited for at N's collect, after this launch.)
            launched = (scheduler_output, self.executor.execute_model_async(scheduler_output))
            launched_at = trace.now() if trace is not None else 0.0
        fill_started = False
        if pending is not None:
            # A launch that waits for its bitmask: the grammars may take these tokens on
            # the fill thread, ahead of its fill (or, in the grammar process, before the
            # scheduler's update, and start that fill then).
            deferred = launched if launched is not None and launched[0].defer_sampling else None
            collected, fill_started = self._collect_pending(
                defer_advance=deferred is not None, fill=deferred,
                void=launched[0].preempted_request_ids if launched is not None else ())
            outputs += collected
        if launched is not None:
            self._pending = launched
            if launched[0].defer_sampling:
                if not fill_started:
                    self._structured.start_deferred_fill(*launched)
                self._unsampled = True
            if not self.scheduler.can_schedule_async():
                # It admitted a history-dependent request: no step may stay in flight.
                outputs += self._collect_pending()[0]
        if trace is not None:
            plan = launched[0] if launched is not None else None
            trace.add(started=started, scheduled=scheduled, launched=launched_at, ended=trace.now(),
                      wait_ms=self._trace_wait * 1e3, update_ms=self._trace_update * 1e3,
                      mask_ms=self._trace_mask * 1e3,
                      num_reqs=len(plan.scheduled_requests) if plan is not None else 0,
                      num_tokens=plan.num_batched_tokens if plan is not None else 0, num_outputs=len(outputs))
            self._trace_wait = self._trace_update = self._trace_mask = 0.0
        return self._outputs(outputs)

    def _step_batches(self) -> EngineCoreOutputs:
        # Pipeline parallelism: launch a batch while fewer than one per stage are in
        # flight, so that stage k runs batch N while stage k + 1 runs batch N - 1; collect
        # the oldest once they are all busy, or when nothing new could be planned (every
        # request's token is in flight). The outputs returned are the collected batch's.
        batches = self._batches
        launched = False
        if len(batches) < self._max_batches and self.scheduler.has_unfinished_requests():
            plan = self._plan()
            # An empty plan goes too when it carries finished or preempted ids (the
            # workers drop those requests' state), or when nothing is in flight.
            if plan.scheduled_requests or plan.finished_request_ids or plan.preempted_request_ids or not batches:
                batches.append((plan, self.executor.execute_model_async(plan)))
                launched = not plan.is_empty
        outputs: list = []
        if batches and (len(batches) == self._max_batches or not launched):
            outputs = self._collect(batches.popleft())[0]
        return self._outputs(outputs)

    def _collect_pending(self, defer_advance: bool = False, fill: tuple[SchedulerOutput, Any] | None = None,
                         void: Sequence[str] = ()) -> tuple[list, bool]:
        """Collect the pending async step (sampled first if it waits for its bitmask).

        Args:
            void: The requests preempted by the plan made since the step's launch (the
                scheduler drops their tokens of it).

        Returns:
            Its outputs, and whether ``fill``'s bitmask was started: given the deferred
            plan launched after it (and its handle), the grammars may take the step's
            tokens before the scheduler applies them and start that fill at once
            (``accept_early``), or, where the worker sends them the tokens
            (``grammar_tokens_to``), before the step is collected.
        """
        self._sample_pending()
        pending, self._pending = self._pending, None
        assert pending is not None
        return self._collect(pending, defer_advance, fill, void)

    def _collect(self, pending: tuple[SchedulerOutput, Any], defer_advance: bool = False,
                 fill: tuple[SchedulerOutput, Any] | None = None, void: Sequence[str] = ()) -> tuple[list, bool]:
        scheduler_output, handle = pending
        started = routed = False
        if scheduler_output.grammar_tokens_to is not None:
            # The worker sends the grammar processes this step's tokens: the next fill can
            # go out now, ahead of them (benchmarks/README.md, "Tokens straight to the
            # grammar processes").
            routed = True
            assert isinstance(self._structured, GrammarProcessClient)  # (only it routes a plan's tokens)
            started = self._structured.take_routed_tokens(scheduler_output, fill, list(void))
        t0 = self._trace.now() if self._trace is not None else 0.0
        runner_output = self._note_worker_output(self.executor.collect(handle))
        t1 = self._trace.now() if self._trace is not None else 0.0
        if fill is not None and not routed and self._structured.has_grammars():
            kept = self.scheduler.kept_tokens(scheduler_output, runner_output,
                                              scheduler_output.structured_output_request_ids)
            started = kept is not None and self._structured.accept_early(kept, *fill)
        outputs = self._finished(self.scheduler.update_from_output(scheduler_output, runner_output), defer_advance)
        if self._trace is not None:
            self._trace_wait += t1 - t0
            self._trace_update += self._trace.now() - t1
        return outputs, started

    def _collect_launched(self) -> list:
        """Collect every launched step, launching none (paused with mode ``keep``)."""
        outputs: list = []
        if self._pending is not None:
            outputs += self._collect_pending()[0]
        while self._batches:
            outputs += self._collect(self._batches.popleft())[0]
        return outputs

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running (or a launched step is uncollected);
        requests held by a pause (until :meth:`resume`) are not counted."""
        return (self.scheduler.has_unfinished_requests() or self._pending is not None or bool(self._batches)
                or bool(self._lora_held)
                or bool(self._grammar_held))

    def has_work(self) -> bool:
        """Whether :meth:`step` has anything to do: requests to run (none while paused with
        mode ``keep``), or a launched step to collect."""
        if self._paused == "all":
            return self._pending is not None or bool(self._batches)
        return self.has_unfinished_requests()

    def make_stats(self) -> SchedulerStats:
        """Queue lengths, KV usage and prefix-cache counters."""
        stats = self.scheduler.make_stats()
        stats.num_waiting += len(self._lora_held)  # held for an adapter slot: waiting too
        stats.num_waiting += len(self._grammar_held)  # and for a grammar
        stats.num_waiting += len(self._pause_held)  # and for resume()
        paused_loras = [lora for _, lora in self._pause_held.values() if lora is not None]
        if self._lora_of or self._lora_held or paused_loras:
            running: Counter[str] = Counter()
            waiting: Counter[str] = Counter()
            for rid, request in self._lora_requests.items():
                name = self._lora_of[rid].lora_name
                (running if request.status == RequestStatus.RUNNING else waiting)[name] += 1
            for lora in [lora for _, lora in self._lora_held] + paused_loras:
                waiting[lora.lora_name] += 1
            stats.running_lora_adapters = dict(running)
            stats.waiting_lora_adapters = dict(waiting)
        stats.lora_loads, stats.lora_evictions = self._lora_loads, self._lora_evictions
        if self._spec_stats is not None:
            stats.spec_decode = dataclasses.replace(
                self._spec_stats, num_accepted_tokens_per_pos=list(self._spec_stats.num_accepted_tokens_per_pos))
        return stats

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forget every cached prefix (see ``LLM.reset_prefix_cache``), with vLLM's semantics.

        The local prefix cache is reset first. Then, with ``reset_connector``, the KV
        connector's store is emptied: every worker side finishes the saves it started
        (``KVConnectorBase.wait_for_pending_saves``), then the scheduler side's
        ``reset_cache()`` runs; its False fails the call, while ``None`` (a connector
        without the hook) or True count as done. Without a connector there is nothing
        to empty: a warning, and False.

        Returns:
            Whether everything asked for was reset.

        Raises:
            ValueError: A flag that is not a bool.
            RuntimeError: ``reset_running_requests=True`` while a step is in flight.
        """
        for name, flag in (("reset_running_requests", reset_running_requests), ("reset_connector", reset_connector)):
            if not isinstance(flag, bool):
                raise ValueError(f"reset_prefix_cache({name}={flag!r}) is invalid: expected True or False")
        if reset_running_requests and (self._pending is not None or self._batches):
            raise RuntimeError("reset_prefix_cache(reset_running_requests=True) while a step is in flight "
                               "(async scheduling or pipeline stages): call it between steps with none "
                               "launched, e.g. after LLM.generate() returns")
        if reset_running_requests:  # (a keyword custom schedulers need only take if it is used)
            ok = self.scheduler.reset_prefix_cache(reset_running_requests=True)  # type: ignore[call-arg]
        else:
            ok = self.scheduler.reset_prefix_cache()
        if reset_connector:
            ok = self._reset_connector() and ok
        return bool(ok)

    def _reset_connector(self) -> bool:
        """Empty the KV connector's store (``reset_prefix_cache(reset_connector=True)``)."""
        connector = self._connector
        if connector is None:
            logger.warning("reset_prefix_cache(reset_connector=True): no KV connector is configured "
                           "(--kv-transfer-config), so there is no store to reset")
            return False
        # A save started before the reset must not land after it (steps run synchronously
        # with a connector, so none is in flight; an asynchronous write may still be).
        self.executor.collective_rpc("wait_for_kv_connector_saves")
        if connector.reset_cache() is False:
            logger.warning("reset_prefix_cache(reset_connector=True): the KV connector %s could not empty its "
                           "store", type(connector).__name__)
            return False
        return True

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Run a worker method on every worker (:meth:`Executor.collective_rpc`); results by rank."""
        return self.executor.collective_rpc(method, timeout, args, kwargs)

    def pause(self, keep: bool = False) -> None:
        """vLLM's pause (``AsyncLLM.pause_generation``): no request is admitted until
        :meth:`resume`; requests that arrive meanwhile are held, in order. The requests the
        scheduler holds run on (they drain: :meth:`is_pause_complete`), or, with ``keep``,
        are frozen where they are (no step is launched; the one in flight is collected).
        Pausing a paused engine changes only ``keep``."""
        self._paused = "all" if keep else "new"

    def is_pause_complete(self) -> bool:
        """Whether the pause has taken hold: paused, and nothing runs (with ``keep``: no
        step in flight; else no request left but the held ones): nothing for
        :meth:`step` to do."""
        return self._paused is not None and not self.has_work()

    def resume(self) -> None:
        """End a pause (none: nothing to do): the held requests go to the scheduler, in
        arrival order (one it refuses fails alone: ``take_request_errors``).

        Raises:
            RuntimeError: Part of the engine sleeps (:meth:`wake_up` resumes once all is awake).
        """
        if self._sleeping:
            raise RuntimeError(f"resume(): the engine sleeps ({', '.join(sorted(self._sleeping))}): "
                               "call wake_up(), which resumes once all is awake")
        self._paused = None
        held, self._pause_held = self._pause_held, {}
        for rid, (request, lora) in held.items():
            try:
                self._queue(request, lora)
            except ValueError as exc:  # (an id the scheduler took meanwhile)
                self._forget_failed([rid])
                self._request_errors.append((rid, str(exc)))

    def is_paused(self) -> bool:
        """Whether the engine is paused (by :meth:`pause`, or by a server's sleep)."""
        return self._paused is not None

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode: the workers free their KV cache (``level`` 2: their weights
        too, :meth:`forkless.worker.worker.Worker.sleep`) until :meth:`wake_up`; the prefix
        cache is forgotten. Unpaused (offline), requests are refused meanwhile; paused (a
        server's sleep: ``AsyncLLM.sleep``), they wait for the wake-up.

        Raises:
            ValueError: Sleep mode is off (``enable_sleep_mode``), or ``level`` is not 1 or 2
                (level 0, a pause, is ``AsyncLLM.sleep``'s alone: an offline engine has
                nobody to resume it).
            RuntimeError: Requests are in flight, or the engine sleeps already.
        """
        if level == 0 and not isinstance(level, bool):
            raise ValueError("sleep(level=0) pauses scheduling, which only a server's engine does "
                             "(AsyncLLM.sleep(0), POST /sleep?level=0): expected 1 or 2")
        self.check_sleep(level)
        if self.has_unfinished_requests():
            raise RuntimeError("sleep(): requests are in flight: let them finish (or abort them) first")
        # The cache's contents are forgotten: no prefix may point into it afterwards.
        if not self.scheduler.reset_prefix_cache():
            raise RuntimeError("sleep(): the prefix cache could not be reset (blocks are still held)")
        self.executor.collective_rpc("sleep", kwargs={"level": level})
        self._sleeping = {"kv_cache", "weights"} if level == 2 else {"kv_cache"}

    def check_sleep(self, level: int, mode: str = "abort") -> None:
        """Raise what :meth:`sleep` would raise for ``level`` but for requests in flight
        (``AsyncLLM.sleep`` asks before it pauses and ends them).

        Raises:
            ValueError: Sleep mode is off (levels 1 and 2), ``level`` is not 0, 1 or 2, or
                ``mode`` is not a pause mode (``keep`` only with level 0, which frees nothing:
                the kept requests' KV cache would be lost).
            RuntimeError: The engine sleeps already.
        """
        if isinstance(level, bool) or level not in (0, 1, 2):
            raise ValueError(f"sleep level={level!r} is invalid: expected 0 (pause scheduling), 1 (free the KV "
                             "cache) or 2 (the KV cache and the weights)")
        check_pause_mode(mode)
        if level and mode == "keep":
            raise ValueError(f"mode='keep' with sleep level {level} is not supported: the kept requests' KV cache "
                             "would be freed; use mode 'abort' or 'wait', or level 0")
        if level and not self.config.model_config.enable_sleep_mode:
            raise ValueError("sleep(): sleep mode is off: build the engine with enable_sleep_mode=True "
                             "(LLM(model, enable_sleep_mode=True); forkless serve --enable-sleep-mode)")
        if self._sleeping:
            raise RuntimeError(f"sleep(): the engine sleeps already ({', '.join(sorted(self._sleeping))})")

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Allocate again what :meth:`sleep` freed: ``tags`` among ``"weights"`` and
        ``"kv_cache"`` (``None``: everything; vLLM's ``"scheduling"`` names the pause, which
        ends once all is awake). A tag that does not sleep is left alone.

        Returns:
            Whether the engine is fully awake now (``AsyncLLM.wake_up``'s answer, vLLM's);
            then a pause ends too (:meth:`resume`).

        Raises:
            ValueError: An unknown tag.
            RuntimeError: The engine neither sleeps nor is paused, or ``kv_cache`` is woken
                while the weights still sleep.
        """
        if tags is not None and (isinstance(tags, str) or not isinstance(tags, (list, tuple, set))):
            raise TypeError(f"wake_up tags must be a list of 'weights' / 'kv_cache' / 'scheduling' or None, "
                            f"got {tags!r}")
        wanted = set(self._sleeping if tags is None else tags) - {"scheduling"}
        unknown = sorted(map(str, wanted - {"weights", "kv_cache"}))
        if unknown:
            raise ValueError(f"wake_up tags {unknown} are invalid: expected 'weights', 'kv_cache' and/or "
                             "'scheduling'")
        if not self._sleeping and self._paused is None:
            raise RuntimeError("wake_up(): the engine is not sleeping")
        wanted &= self._sleeping
        if "kv_cache" in wanted and "weights" in self._sleeping - wanted:
            raise RuntimeError("wake_up(['kv_cache']) while the weights sleep: wake 'weights' first (or both)")
        if wanted:
            self.executor.collective_rpc("wake_up", kwargs={"tags": sorted(wanted)})
        self._sleeping -= wanted
        if not self._sleeping:
            self.resume()
        return not self._sleeping

    def is_sleeping(self) -> bool:
        """Whether the engine sleeps (part of it may have been woken already) or is paused
        (vLLM's answer: a pause is sleep level 0)."""
        return bool(self._sleeping) or self._paused is not None

    def check_health(self) -> None:
        """Raise when a worker is unhealthy."""
        self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""
        if self._trace is not None:
            self._trace.close()
        self._structured.shutdown()
        try:
            self.executor.shutdown()
        finally:
            if self._connector is not None:
                self._connector.shutdown()


def _structured_output_manager(config: EngineConfig, executor: Executor
                               ) -> StructuredOutputManager | GrammarProcessClient:
    """The engine core's grammars (nothing is built until a constrained request arrives):
    in a process of their own where the executor has a shared bitmask buffer and
    ``FORKLESS_GRAMMAR_PROCESS`` says so (unset: with the ``mp`` executor, where it measured
    ahead: benchmarks/README.md, "The grammar process takes the tokens before the
    scheduler's update"), else on the engine core's threads."""
    mc = config.model_config
    eos = [mc.eos_token_id] if mc.eos_token_id is not None else []
    extra = mc.generation_config.get("eos_token_id")
    for tok in extra if isinstance(extra, list) else [extra]:
        if tok is not None and int(tok) not in eos:
            eos.append(int(tok))
    so_config = config.structured_outputs_config or StructuredOutputsConfig()
    use_process = envs.FORKLESS_GRAMMAR_PROCESS
    if use_process is None:
        use_process = config.parallel_config.distributed_executor_backend == "mp"
    if use_process:
        if executor.supports_shared_bitmask_buffer:
            return GrammarProcessClient(so_config, mc.tokenizer, mc.vocab_size, eos,
                                        executor.allocate_shared_bitmask_buffer, executor.deferred_sample_route,
                                        envs.FORKLESS_GRAMMAR_PROCESSES,
                                        executor.routes_grammar_tokens and envs.FORKLESS_GRAMMAR_ROUTE_TOKENS)
        logger.warning("FORKLESS_GRAMMAR_PROCESS: the %s executor has no shared bitmask buffer; "
                       "the grammars stay in the engine core", type(executor).__name__)
    return StructuredOutputManager(so_config, mc.tokenizer, mc.vocab_size, eos, executor.allocate_bitmask_buffer)
