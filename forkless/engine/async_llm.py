"""``AsyncLLM``: the asynchronous engine the API server uses (also usable in-process).

It tokenizes and validates requests here, sends them to the engine core process,
detokenizes what comes back, and streams ``RequestOutput``s to each caller. It owns the
stat loggers. If the engine core or a worker dies, every in-flight request fails at once
with ``EngineDeadError`` and ``dead_event`` is set; its message (and ``dead_reason``) is
one line, without the traceback that the log gets.

A server shutting down calls :meth:`AsyncLLM.stop_accepting` (new requests are refused
with ``EngineShuttingDownError``) and, when its grace period is over,
:meth:`AsyncLLM.abort_in_flight` (the requests still running end with that error). It is
an ``EngineDeadError``, so every path that answers a dead engine with a 503 (a JSON body,
or an SSE error event and ``[DONE]`` once a stream has begun) answers it the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence, TypeVar

import msgspec

from forkless import envs
from forkless.protocol import ipc
from forkless.protocol.engine import check_pause_mode
from forkless.engine.core_client_mp import EngineCoreClient, EngineDeadError
from forkless.engine.main_guard import check_not_bootstrapping
from forkless.engine.output_processor import OutputProcessor
from forkless.engine.stop_strings import check_stop_strings
from forkless.engine.processor import Processor
from forkless.logger import init_logger
from forkless.sampling_params import RequestOutputKind
from forkless.metrics import (
    IntervalViews,
    LoggingStatLogger,
    StatLoggerBase,
    iteration_stats,
    load_stat_logger_plugin_factories,
    make_stat_logger,
)

if TYPE_CHECKING:
    from forkless.config import EngineArgs, EngineConfig
    from forkless.outputs import PoolingRequestOutput, RequestOutput
    from forkless.pooling_params import PoolingParams
    from forkless.protocol.lora import LoRARequest
    from forkless.sampling_params import BeamSearchParams, SamplingParams

logger = init_logger("forkless.engine.async_llm")

# How long the output handler may go on applying queued engine-core messages before it
# lets the streams and routes run (a few steps' worth at hundreds of streams; short
# enough that /health and new requests never wait noticeably).
OUTPUT_DRAIN_SECONDS = 0.025

# True while AsyncLLM.send runs a stream up to its request's send: the stream then yields
# _SENT there (to send(), never to a reader), and reads its outputs when iterated later.
_SEND_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("forkless_send_only", default=False)
_SENT: Any = object()
T = TypeVar("T")

__all__ = ["AsyncLLM", "EngineDeadError", "EngineShuttingDownError", "InvalidRequestError", "RequestFailedError",
           "close_streams", "gather_streams"]


class InvalidRequestError(ValueError):
    """The engine refused a request (bad prompt or sampling parameters)."""


class RequestFailedError(RuntimeError):
    """A request failed on the engine's side, the others going on: a server error, not the
    client's. ``status`` is its HTTP status: 500 (its KV cache failed to load under
    ``kv_load_failure_policy: fail``)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class EngineShuttingDownError(EngineDeadError):
    """The server is shutting down: a new request is refused, or one in flight is ended."""


class _Aborted(Exception):
    """Ends a pooling request's stream that :meth:`AsyncLLM.abort` aborted (a generation's
    ends with its last output instead). An exception so that it queues after the outputs
    before it, never merged into them."""


class _OutputSlot:
    """What a request's stream has not taken yet.

    When the stream fell behind (hundreds of streams on one event loop) the outputs it
    missed become one: a ``CUMULATIVE`` output holds everything before it, so only the
    newest is kept; a ``DELTA`` output is merged into the one waiting
    (``RequestOutput.add``: per completion, text, token ids and logprobs concatenated).
    One chunk to send instead of one per step it missed. ``FINAL_ONLY`` outputs queue
    (there is one); an error queues after the outputs it followed.
    """

    def __init__(self, kind: RequestOutputKind = RequestOutputKind.CUMULATIVE) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._ready = asyncio.Event()
        self._replace = kind is RequestOutputKind.CUMULATIVE
        self._aggregate = kind is RequestOutputKind.DELTA

    def put_nowait(self, item: Any) -> None:
        """Add an output or an exception (never blocks)."""
        items = self._items
        if (items and (self._replace or self._aggregate) and not isinstance(item, BaseException)
                and not isinstance(items[-1], BaseException)):
            if self._replace:
                items[-1] = item
            else:
                items[-1].add(item, aggregate=True)
        else:
            items.append(item)
        self._ready.set()

    async def get(self) -> Any:
        """The next output or exception, waiting for one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


async def gather_streams(streams: Sequence[AsyncIterator[Any]],
                         consume: Callable[[AsyncIterator[Any]], Awaitable[T]]) -> list[T]:
    """``consume(stream)`` for every stream at once; their results, in order.

    If one raises, or the caller is cancelled (its client gone), the others are cancelled
    and every stream is closed -- which aborts the engine requests that had not finished
    -- before the error is raised: no sibling of a failed request runs on.
    """
    tasks = [asyncio.ensure_future(consume(s)) for s in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        await close_streams(tasks, streams)
        raise


async def close_streams(readers: Sequence["asyncio.Future[Any]"], streams: Sequence[AsyncIterator[Any]]) -> None:
    """Cancel the tasks reading ``streams`` and wait for them, then close every stream:
    the engine requests that had not finished are aborted."""
    for t in readers:
        t.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for s in streams:
        aclose = getattr(s, "aclose", None)
        if aclose is not None:
            await aclose()


def _is_prometheus(item: Any) -> bool:
    """Whether a stat logger class or instance is a Prometheus logger (it then replaces the
    default one instead of running beside it)."""
    from forkless.metrics.prometheus import PrometheusStatLogger

    return isinstance(item, PrometheusStatLogger) or (isinstance(item, type)
                                                      and issubclass(item, PrometheusStatLogger))


def _make_prometheus(item: Any, source: str, config: "EngineConfig") -> Any:
    """The Prometheus stat logger: ``item`` as is when an instance, else constructed with the
    default one's arguments (the model config, the engine index, and the series it adds
    for LoRA, speculative decoding and KV connectors).

    Raises:
        RuntimeError: A user's class raised in its constructor (the message names ``source``).
    """
    if not isinstance(item, type):
        return item
    spec = config.speculative_config
    kwargs = {"max_loras": config.lora_config.max_loras if config.lora_config is not None else None,
              "num_speculative_tokens": spec.num_speculative_tokens if spec is not None else None,
              "kv_transfer": config.kv_transfer_config is not None}
    try:
        return item(config.model_config, 0, **kwargs)
    except Exception as e:
        if not source:
            raise
        raise RuntimeError(f"{source}: {item.__module__}.{item.__qualname__}(model_config, 0, "
                           f"{', '.join(f'{k}=...' for k in kwargs)}) raised {type(e).__name__}: {e}") from e


def _encode_requests(requests: list[Any]) -> list[bytes]:
    """The engine core's messages for ``requests``, each decoded back as the engine core
    will decode it: a value msgpack cannot carry (an integer past 64 bits) or of a type
    the core's typed decoding refuses (a string where a flag must be a boolean) is the
    client's 400 here, never a failure inside the engine core.

    Raises:
        InvalidRequestError: Naming the value (msgspec's path to it).
    """
    from forkless.protocol.engine import EngineCoreRequest

    try:
        payloads = [ipc.encode(r) for r in requests]
        for payload in payloads:
            ipc.decode(payload, EngineCoreRequest)
    except (OverflowError, TypeError, msgspec.EncodeError) as exc:
        raise InvalidRequestError(f"the request has a value the engine cannot accept: {exc} "
                                  "(e.g. an integer outside the 64-bit range)") from None
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"the request has a value of the wrong type: {exc}") from None
    return payloads


class AsyncLLM:
    """Asynchronous generation over an engine core in its own process.

    Args:
        config: The engine configuration.
        stat_loggers: Extra stat loggers: ``StatLoggerBase`` subclasses (constructed as
            ``cls(config, 0)``, vLLM's ``(vllm_config, engine_idx)``) or instances. A
            ``PrometheusStatLogger`` subclass or instance (given here or as a plugin)
            replaces the default Prometheus logger, as in vLLM, the last one winning; a
            class is constructed as the default is, ``cls(model_config, 0, max_loras=...,
            num_speculative_tokens=..., kv_transfer=...)``.
        log_stats: Whether to keep statistics (vLLM's rule, ``--disable-log-stats``
            turns it off): the periodic throughput line, the Prometheus metrics of
            ``render_metrics`` and each ``RequestOutput.metrics`` (vLLM's
            ``RequestStateStats``, from the lifecycle events the engine core then
            records). Off, ``render_metrics`` is empty and ``metrics`` is ``None``, unless
            stat loggers are given or installed as plugins: they then run, with the
            Prometheus metrics and ``metrics``, and only the periodic line stays off.

    Raises:
        ValueError, ImportError, TypeError: ``distributed_executor_backend`` names no
            registered executor, does not import, or is not an ``Executor`` subclass.
    """

    def __init__(self, config: "EngineConfig", stat_loggers: list[Any] | None = None,
                 log_stats: bool = True) -> None:
        from forkless.executor import get_executor_cls
        from forkless.metrics.prometheus import PrometheusStatLogger

        check_not_bootstrapping("AsyncLLM()")
        # Resolved here, in the caller's process, before start() spawns the engine core: a
        # bad --distributed-executor-backend fails at once instead of in the engine core.
        get_executor_cls(config.parallel_config.distributed_executor_backend)
        self.config = config
        self.processor = Processor(config)
        # Built on first use: the tokenizer loads while the engine core starts (see start()).
        self._output_processor: OutputProcessor | None = None
        self.client: EngineCoreClient | None = None
        # start() as a task, when the first request started the engine (vLLM's AsyncLLM is
        # usable as built; here the engine core starts on the first request unless start()
        # was awaited first).
        self._starting: asyncio.Future[None] | None = None
        self._started = False
        # Each stream's slot, by request id; and by engine-core id (for the engine's
        # refusals). A stream removes only its own entries: an id whose request has ended
        # may be taken by a new request before the old stream reads that end.
        self._queues: dict[str, _OutputSlot] = {}
        self._slot_of: dict[str, _OutputSlot] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Utility calls awaiting the engine core's answer (_call_utility), by call id.
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._next_call_id = 0
        self.errored = False
        self.dead_reason: str | None = None
        # vLLM's: with --enable-log-requests, aborts are logged too (the server sets it).
        self.log_requests = False
        # Set by stop_accepting() and abort_in_flight() when the server shuts down.
        self._refuse_new: str | None = None
        self._end_in_flight: str | None = None
        self.dead_event: asyncio.Event | None = None
        plugins = load_stat_logger_plugin_factories()
        # As vLLM's AsyncLLM: without log_stats no statistics are kept (no periodic line,
        # no Prometheus series: /metrics answers, empty), unless there are stat loggers
        # of the user's own, which then get them, and the Prometheus logger with them.
        self.log_stats = log_stats or bool(plugins or stat_loggers)
        if not log_stats and self.log_stats:
            logger.info("statistics are on for the stat loggers given or installed as plugins, "
                        "without the periodic log line (log_stats=False, --disable-log-stats)")
        custom = [(cls, f"stat logger plugin {cls.__qualname__}") for cls in plugins]
        custom += [(item, "AsyncLLM(stat_loggers=...)") for item in stat_loggers or []]
        # As vLLM's StatLoggerManager: a PrometheusStatLogger subclass (or instance) of the
        # user's replaces the default one, the last given winning; /metrics renders it.
        prometheus: tuple[Any, str] = (PrometheusStatLogger, "")
        for item, source in custom:
            if _is_prometheus(item):
                if prometheus[1]:  # vLLM keeps the last one silently; say which is dropped
                    logger.warning("%s: %r replaces %r (%s) as the Prometheus stat logger: only one serves "
                                   "/metrics", source, item, prometheus[0], prometheus[1])
                prometheus = (item, source)
        if prometheus[1]:
            logger.info("%s: %r replaces the default Prometheus stat logger", prometheus[1], prometheus[0])
        self.prometheus: PrometheusStatLogger | None = None
        self.stat_loggers: list[StatLoggerBase] = []
        if self.log_stats:
            self.prometheus = _make_prometheus(prometheus[0], prometheus[1], config)
            self.stat_loggers.append(self.prometheus)
        self._stat_logger_failures: dict[int, int] = {}  # id(logger) -> failed record() calls
        self._interval_views = IntervalViews()  # vLLM's per-interval fields of the stats
        if log_stats:
            self.stat_loggers.append(LoggingStatLogger(config))
        for item, source in custom:
            if not _is_prometheus(item):
                self.stat_loggers.append(make_stat_logger(item, config, source))
        self.log_interval = envs.FORKLESS_LOG_STATS_INTERVAL

    @classmethod
    def from_vllm_config(cls, vllm_config: "EngineConfig", start_engine_loop: bool = True, usage_context: Any = None,
                         stat_loggers: list[Any] | None = None, enable_log_requests: bool = False,
                         disable_log_stats: bool = False) -> "AsyncLLM":
        """vLLM's constructor from a whole configuration (``EngineArgs.create_engine_config()``).

        Args:
            vllm_config: The engine configuration.
            start_engine_loop: vLLM's; forkless starts the engine core on :meth:`start` or
                the first request either way, so only ``True`` is taken.
            usage_context: vLLM's telemetry label; forkless reports none.
            stat_loggers: As the constructor's.
            enable_log_requests: Log each request's abort (the server logs the requests).
            disable_log_stats: No periodic statistics line.

        Raises:
            ValueError: ``start_engine_loop=False``, which forkless does not have.
        """
        if not start_engine_loop:
            raise ValueError("start_engine_loop=False: forkless's AsyncLLM starts its engine core with start() or "
                             "the first request; leave it True")
        engine = cls(vllm_config, stat_loggers=stat_loggers, log_stats=not disable_log_stats)
        engine.log_requests = enable_log_requests
        return engine

    @classmethod
    def from_engine_args(cls, engine_args: "EngineArgs", **kwargs: Any) -> "AsyncLLM":
        """Build from engine arguments; ``disable_log_stats`` turns the periodic log line
        off unless ``log_stats`` is given explicitly (as vLLM's ``from_engine_args``)."""
        kwargs.setdefault("log_stats", not engine_args.disable_log_stats)
        return cls(engine_args.create_engine_config(), **kwargs)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, timeout: float = 900.0, *, while_starting: Callable[[], object] | None = None) -> None:
        """Start the engine core process and wait until it has loaded the model.

        Args:
            timeout: Seconds the engine core has to load the model.
            while_starting: More start-up work of the caller (the server imports its HTTP
                app) run in the tokenizer's thread after the tokenizer, while the engine
                core starts; what it raises is raised here.
        """
        self.dead_event = asyncio.Event()
        # The engine core records request events only when there are statistics to keep.
        self.client = EngineCoreClient(self.config, log_stats=self.log_stats)

        def load() -> None:
            self.output_processor  # noqa: B018 (loads the tokenizer)
            self.processor.reasoning_token_ids  # noqa: B018 (a --reasoning-config that fails fails the start)
            if while_starting is not None:
                while_starting()

        # Importing transformers and loading the tokenizer take seconds; the engine core and
        # its workers are importing torch and loading the model meanwhile, so overlap them.
        # One thread, not one per task: two threads importing at once can meet in a
        # circular import, which Python reports as a deadlock.
        tokenizer = asyncio.ensure_future(asyncio.to_thread(load))
        try:
            try:
                await self.client.wait_ready(timeout)
            finally:
                await asyncio.wait([tokenizer])
            tokenizer.result()
        except BaseException:
            self.shutdown()  # a failed start leaves no process or IPC directory behind
            raise
        # As vLLM's handshake: the caller's config learns the KV cache's size.
        self.config.cache_config.num_blocks = self.client.ready_info.get("num_blocks")
        for stat_logger in self.stat_loggers:
            stat_logger.log_engine_initialized()
        self._tasks.append(asyncio.create_task(self._handle_outputs()))
        self._tasks.append(asyncio.create_task(self._log_periodically()))
        self._started = True

    async def _ensure_started(self) -> None:
        """Start the engine for the first request when nobody awaited :meth:`start`; the
        requests that arrive meanwhile wait for the same start."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self.start())
        await asyncio.shield(self._starting)

    def shutdown(self) -> None:
        """Stop the engine core and its workers (idempotent)."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        for future in self._calls.values():  # (nothing would answer them now)
            if not future.done():
                future.set_exception(EngineShuttingDownError("the engine was shut down"))
        if self.client is not None:
            self.client.shutdown()

    def stop_accepting(self) -> None:
        """Refuse new requests from now on (``EngineShuttingDownError``); the requests
        in flight carry on."""
        self._refuse_new = "the server is shutting down and accepts no new requests"

    def abort_in_flight(self, reason: str) -> int:
        """End every request in flight, and any started later, with
        ``EngineShuttingDownError(reason)``; they are aborted in the engine core.

        Returns:
            How many requests were in flight.
        """
        self._end_in_flight = reason
        error = EngineShuttingDownError(reason)
        for queue in self._queues.values():
            queue.put_nowait(error)
        return len(self._queues)

    @property
    def num_requests_in_flight(self) -> int:
        """Requests whose outputs are being streamed to a caller."""
        return len(self._queues)

    @property
    def requests_in_flight(self) -> list[str]:
        """The ids of those requests (as given to :meth:`generate` and :meth:`encode`)."""
        return list(self._queues)

    # -- properties the server uses -----------------------------------------------------
    @property
    def output_processor(self) -> OutputProcessor:
        if self._output_processor is None:
            self._output_processor = OutputProcessor(
                self.processor.tokenizer, log_stats=self.log_stats,
                stream_interval=self.config.scheduler_config.stream_interval)
        return self._output_processor

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def model_path(self) -> str:
        return self.config.model_config.model

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        """Render and tokenize a conversation with the model's chat template."""
        return list(self.processor.apply_chat_template(messages, **kwargs)["prompt_token_ids"])

    def render_metrics(self) -> bytes:
        """The Prometheus exposition text of ``GET /metrics`` (empty without statistics)."""
        return self.prometheus.render() if self.prometheus is not None else b""

    # -- requests -----------------------------------------------------------------------
    def generate(self, prompt: Any, sampling_params: "SamplingParams", request_id: str,
                 priority: int = 0, group_id: str | None = None,
                 lora_request: "LoRARequest | None" = None,
                 client_key: str | None = None) -> AsyncGenerator["RequestOutput", None]:
        """Validate a request now, and return the stream of its outputs (cumulative, or as
        ``sampling_params.output_kind`` asks; ``DELTA`` outputs a slow reader missed arrive
        merged into one). With ``lora_request`` it generates with that LoRA adapter.

        The request is sent to the engine when the stream is first iterated (or by
        :meth:`send`); closing the
        stream early (a client that went away) aborts it. ``client_key`` names who sent it
        (the API server's ``user`` field or peer address): with
        ``--max-prefill-tokens-per-client`` the scheduler shares each step's prefill
        among the clients with requests in the engine.

        Raises:
            InvalidRequestError: The prompt or parameters are invalid (raised here, before
                anything is streamed, so a server can still answer 400).
            EngineDeadError: The engine died.
            EngineShuttingDownError: The server is shutting down.
        """
        self._check_open()
        return self._submit(prompt, sampling_params, request_id, priority, group_id, lora_request, client_key)

    async def send(self, streams: Iterable[AsyncGenerator[Any, None]]) -> None:
        """Send now the requests of streams that :meth:`generate` or :meth:`encode`
        returned, rather than when each is first iterated (a beam search still sends each
        step as it is iterated). Reading them later is as before.

        A server calls this from the handler that validated the request. Its response is
        streamed by a task of its own, which the event loop runs only after the handlers of
        every request that arrived meanwhile: sent from there, a burst of hundreds of
        requests would reach the engine only once all of them were parsed, the engine idle
        until then.

        Raises:
            EngineDeadError: The engine died, or (``EngineShuttingDownError``) the server
                is shutting down. Every stream given is then closed, which aborts the
                requests already sent.
        """
        streams = list(streams)
        if not self._started:
            # Started first, so that the engine's own tasks do not begin in send()'s context.
            await self._ensure_started()
        token = _SEND_ONLY.set(True)
        try:
            for stream in streams:
                marker = await anext(stream)
                assert marker is _SENT, "send() takes the streams of generate() and encode()"
        except BaseException:
            for stream in streams:
                await stream.aclose()
            raise
        finally:
            _SEND_ONLY.reset(token)

    # -- the engine core's methods (vLLM's EngineClient) ------------------------------------
    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forget every cached prefix, as ``LLM.reset_prefix_cache`` (vLLM's keywords).

        Returns:
            Whether it was reset (False while running requests hold blocks, unless
            ``reset_running_requests`` preempts them first).
        """
        return bool(await self._call_utility("reset_prefix_cache", reset_running_requests, reset_connector))

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        """Stop generating until :meth:`resume_generation` (vLLM's, for weight updates:
        ``collective_rpc`` while paused). Requests sent meanwhile are taken and wait, in
        order; they run after the resume.

        Args:
            mode: What happens to the requests in flight: ``"abort"`` ends them (their
                streams end with ``finish_reason`` ``abort``); ``"wait"`` lets them
                finish; ``"keep"`` freezes them where they are, their KV cache kept, to go
                on after the resume.
            clear_cache: Forget the prefix cache once nothing runs (not with ``keep``,
                whose frozen requests hold their blocks).

        Returns once the pause has taken hold: nothing runs on the device.

        Raises:
            ValueError: ``mode`` is not one of the three, or ``clear_cache`` is not a bool.
        """
        check_pause_mode(mode)
        if not isinstance(clear_cache, bool):
            raise ValueError(f"clear_cache={clear_cache!r} is invalid: expected True or False")
        # The requests in flight now, before the pause reaches the engine core (no await
        # in between): those that come later wait for the resume instead of ending.
        in_flight = list(self._queues) if mode == "abort" else []
        await self._call_utility("pause", mode == "keep")
        if in_flight:
            await self.abort(in_flight)
        while not await self._call_utility("is_pause_complete"):  # (EngineDeadError if it dies meanwhile)
            await asyncio.sleep(0.01)
        if clear_cache and mode != "keep":
            await self._call_utility("reset_prefix_cache")

    async def resume_generation(self) -> None:
        """End :meth:`pause_generation`'s pause (none: nothing to do): the requests that
        waited run, in the order they came.

        Raises:
            RuntimeError: The engine sleeps (:meth:`wake_up` resumes once all is awake).
        """
        await self._call_utility("resume")

    async def is_paused(self) -> bool:
        """Whether the engine is paused (:meth:`pause_generation`, or asleep: :meth:`sleep`)."""
        return bool(await self._call_utility("is_paused"))

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's sleep mode: pause (:meth:`pause_generation`), then the workers free their
        KV cache (``level`` 2: their weights too; ``--enable-sleep-mode``) until
        :meth:`wake_up`. Requests sent meanwhile wait for the wake-up.

        Args:
            level: 0 only pauses (no sleep mode needed), 1 frees the KV cache, 2 the
                weights too.
            mode: What happens to the requests in flight, as :meth:`pause_generation`'s
                (``keep`` only with level 0: freeing the KV cache would lose theirs).

        Raises:
            ValueError: Sleep mode is off (level 1 or 2), ``level`` is not 0, 1 or 2, or
                ``mode`` is not a pause mode (or ``keep`` above level 0).
            RuntimeError: The engine sleeps already.
        """
        await self._call_utility("check_sleep", level, mode)  # (before anything in flight ends)
        await self.pause_generation(mode=mode, clear_cache=False)
        if level:
            await self._call_utility("sleep", level)  # (it forgets the prefix cache)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Allocate again what :meth:`sleep` freed (``tags``: ``"weights"``, ``"kv_cache"``;
        ``None``: everything; ``"scheduling"``: the pause), resuming once all is awake.

        Returns:
            Whether the engine is fully awake (vLLM's answer).

        Raises:
            ValueError: An unknown tag.
            RuntimeError: The engine neither sleeps nor is paused, or the KV cache is woken
                before the weights.
        """
        return bool(await self._call_utility("wake_up", tags))

    async def is_sleeping(self) -> bool:
        """Whether the engine sleeps (part of it may be awake already) or is paused
        (vLLM's answer)."""
        return bool(await self._call_utility("is_sleeping"))

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = (),
                             kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Run a worker method on every worker, between steps, as vLLM's
        ``AsyncLLM.collective_rpc`` (``LLM.collective_rpc``'s rules: a public method of the
        worker class or of ``worker_extension_cls``, by name; plain data both ways).

        Returns:
            One result per worker, by rank.

        Raises:
            TypeError: ``method`` is not a name, or the arguments or a result are not plain data.
            RuntimeError: The worker has no such method, or it raised (the worker's message
                and traceback), or ``timeout`` passed; the engine goes on.
        """
        if not isinstance(method, str):
            raise TypeError(f"AsyncLLM.collective_rpc takes the name of a worker method, got {type(method).__name__}: "
                            "the workers run in other processes")
        return list(await self._call_utility("collective_rpc", method, timeout, list(args), kwargs or {}))

    async def check_health(self) -> None:
        """Raise :class:`EngineDeadError` unless the engine and every worker answer (a dead
        worker fails the engine)."""
        await self._call_utility("check_health")

    async def _call_utility(self, method: str, *args: Any) -> Any:
        """Call the engine core's ``method`` between its steps and wait for its answer.

        Raises:
            ValueError, TypeError, RuntimeError: The engine core refused the call (its
                message), or its arguments cannot cross to it (an integer beyond 64 bits:
                ValueError; an object: TypeError).
            EngineDeadError: The engine is dead or shutting down.
        """
        if not self._started:
            await self._ensure_started()
        if self.errored:
            raise EngineDeadError(f"the engine is dead: {self.dead_reason}")
        assert self.client is not None
        call_id, self._next_call_id = self._next_call_id, self._next_call_id + 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            try:
                await self.client.call_utility({"call_id": call_id, "method": method, "args": list(args)})
            except (OverflowError, TypeError) as exc:  # (msgpack's refusal: an int beyond 64 bits, an object)
                error = ValueError if isinstance(exc, OverflowError) else TypeError
                raise error(f"{method}{tuple(args)!r:.200} is invalid: expected plain data with 64-bit "
                            f"integers: {exc}") from None
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def check_structured_outputs(self, sampling_params: "SamplingParams") -> None:
        """Check a request's structured-output constraint in a thread, before
        :meth:`generate` (which checks it again, on the caller's event loop, where a
        large constraint's first check would stall every other stream for a second or
        more; the second is a lookup).

        Raises:
            InvalidRequestError: The constraint is invalid or no backend supports it.
        """
        if sampling_params.structured_outputs is None:
            return
        try:
            await asyncio.to_thread(self.processor.check_structured_outputs, sampling_params)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None

    def _submit(self, prompt: Any, sampling_params: "SamplingParams", request_id: str, priority: int = 0,
                group_id: str | None = None, lora_request: "LoRARequest | None" = None,
                client_key: str | None = None) -> AsyncGenerator["RequestOutput", None]:
        """:meth:`generate` once the engine takes the request: also a beam search's next step,
        which a draining server still runs (the search was admitted before the signal)."""
        try:
            # Refused here, as a 400, rather than when the output processor indexes them.
            check_stop_strings(sampling_params.stop if sampling_params is not None else None)
            processed = self.processor.process_inputs(request_id, prompt, sampling_params, priority=priority,
                                                      group_id=group_id, lora_request=lora_request,
                                                      client_key=client_key)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return self._stream(processed, _encode_requests(processed.core_requests))

    def beam_search(self, prompt: Any, request_id: str, params: "BeamSearchParams",
                    lora_request: "LoRARequest | None" = None, priority: int = 0,
                    client_key: str | None = None) -> AsyncGenerator["RequestOutput", None]:
        """Validate a beam search now, and return a stream of one output: the
        ``beam_width`` best sequences as its completions, best first (vLLM's
        ``EngineClient.beam_search``; the algorithm is :mod:`forkless.beam_search`).

        Each step's beams are one-token requests named ``{request_id}-beam{step}.{i}``,
        grouped under ``request_id``; closing the stream aborts the step in flight.

        Raises:
            InvalidRequestError: The prompt is invalid, or ``2 * beam_width`` logprobs a
                step are over ``--max-logprobs``.
            EngineDeadError: The engine died.
            EngineShuttingDownError: The server is shutting down.
        """
        from forkless.beam_search import BeamSearch

        self._check_open()
        try:
            ids = self.processor.prompt_token_ids(prompt)
            search = BeamSearch([ids], params, self.processor.eos_token_id, self.config.model_config,
                                [lora_request])
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return self._beam_search(search, request_id, ids, priority, client_key)

    async def _beam_search(self, search: Any, request_id: str, ids: list[int], priority: int,
                           client_key: str | None) -> AsyncGenerator["RequestOutput", None]:
        from forkless.outputs import CompletionOutput, RequestOutput

        async def last(stream: AsyncGenerator["RequestOutput", None]) -> "RequestOutput":
            async for out in stream:
                final = out
            return final

        if _SEND_ONLY.get():
            yield _SENT  # each step is sent as the search runs
        step = 0
        while requests := search.requests():
            if self.errored:
                raise EngineDeadError(f"the engine is dead: {self.dead_reason}")
            streams = [self._submit(p, search.step_params, f"{request_id}-beam{step}.{i}", priority=priority,
                                    group_id=request_id, lora_request=lora, client_key=client_key)
                       for i, (p, lora) in enumerate(requests)]
            search.advance(await gather_streams(streams, last))
            step += 1
        best = search.results(self.tokenizer)[0].sequences
        yield RequestOutput(
            request_id=request_id, prompt=None, prompt_token_ids=ids, finished=True,
            outputs=[CompletionOutput(index=i, text=b.text, token_ids=b.tokens[len(ids):],
                                      cumulative_logprob=b.cum_logprob, logprobs=b.logprobs,
                                      finish_reason=b.finish_reason, stop_reason=b.stop_reason)
                     for i, b in enumerate(best)])

    def _check_open(self) -> None:
        """Raise unless the engine takes new requests (dead, draining, or not started)."""
        if self.errored:
            raise EngineDeadError(f"the engine is dead: {self.dead_reason}")
        if self._refuse_new is not None:
            raise EngineShuttingDownError(self._refuse_new)

    def encode(self, prompt: Any, pooling_params: "PoolingParams | None", request_id: str, priority: int = 0,
               group_id: str | None = None, client_key: str | None = None
               ) -> AsyncGenerator["PoolingRequestOutput", None]:
        """Validate a pooling request now, and return the stream of its one output (a
        ``PoolingRequestOutput``, when its prompt has run).

        Raises:
            InvalidRequestError: The input or parameters are invalid (before anything is
                streamed), or the model is not a pooling model.
            EngineDeadError: The engine died.
            EngineShuttingDownError: The server is shutting down.
        """
        self._check_open()
        try:
            processed = self.processor.process_pooling_inputs(request_id, prompt, pooling_params, priority=priority,
                                                              group_id=group_id, client_key=client_key)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return self._stream(processed, _encode_requests(processed.core_requests))

    async def _stream(self, processed: Any, payloads: list[bytes]) -> AsyncGenerator["RequestOutput", None]:
        if not self._started:
            await self._ensure_started()
        assert self.client is not None
        if self._end_in_flight is not None:  # validated before the grace period ended
            raise EngineShuttingDownError(self._end_in_flight)
        if self.errored:  # died since the request was validated: _die() told only the streams before it
            raise EngineDeadError(f"the engine is dead: {self.dead_reason}")
        request_id = processed.request_id
        queue = _OutputSlot(processed.params.output_kind)
        self.output_processor.add_request(processed)
        self._queues[request_id] = queue
        finished = False
        try:
            for core_request, payload in zip(processed.core_requests, payloads):
                self._slot_of[core_request.request_id] = queue
                await self.client.add_request(payload)
            if _SEND_ONLY.get():
                yield _SENT
            while True:
                item = await queue.get()
                if isinstance(item, _Aborted):  # abort() ended a pooling request: no result
                    finished = True
                    return
                if isinstance(item, BaseException):
                    # A dead engine has nothing left to abort; a refused request or one
                    # ended by a shutdown is aborted below.
                    finished = self.errored
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            # A slot that is no longer this stream's means that its request has ended and
            # a new one took the id: that one is not to be aborted.
            own = self._queues.get(request_id) is queue
            self._forget(request_id, processed.core_requests, queue)
            if not finished and own:
                await self.abort(request_id)

    def _forget(self, request_id: str, core_requests: list[Any], queue: _OutputSlot) -> None:
        """Drop a stream's entries (only its own: see ``_queues``)."""
        if self._queues.get(request_id) is queue:
            del self._queues[request_id]
        for core_request in core_requests:
            if self._slot_of.get(core_request.request_id) is queue:
                del self._slot_of[core_request.request_id]

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests by their ids (vLLM's ``AsyncLLM.abort``; no error for one that
        already finished). A stream still reading one ends: with a last output whose
        unfinished completions say ``"abort"``, as vLLM's, or, for a pooling request
        (which has no result then), with none."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        finals: dict[str, Any] = {}
        core_ids = self.output_processor.abort_requests(ids, finals)
        if self.log_requests and finals:
            logger.info("aborted request(s) %s", ", ".join(finals))
        for rid, final in finals.items():
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(final if final is not None else _Aborted())
        if core_ids and self.client is not None and not self.errored:
            await self.client.abort_requests(core_ids)

    # -- background tasks ---------------------------------------------------------------
    async def _handle_outputs(self) -> None:
        assert self.client is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                message = await self.client.get_message(500)
                if message is None:
                    if not self.client.is_alive():
                        self._die(f"the engine core process exited with code {self.client.proc.exitcode}")
                        return
                    continue
                # Every message already queued is applied before the streams run, within
                # OUTPUT_DRAIN_SECONDS. A server that keeps up sees one message at a time;
                # one that fell behind (hundreds of streams) merges the steps it missed
                # into one chunk per stream (_OutputSlot), so each stream's send costs it
                # once per batch of steps instead of once per step, and the backlog
                # shrinks instead of growing by the sends' excess over the step time.
                deadline = loop.time() + OUTPUT_DRAIN_SECONDS
                while message is not None:
                    if not await self._handle_message(*message):
                        return
                    message = self.client.next_queued_message() if loop.time() < deadline else None
                # Let the streams and the other routes run before the next message.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.error("output handler failed", exc_info=True)
            self._die(f"output handler failed: {type(exc).__name__}: {exc}")

    async def _handle_message(self, kind: bytes, payload: bytes) -> bool:
        """Apply one message from the engine core; False once the engine is dead."""
        from forkless.protocol.engine import EngineCoreOutputs

        assert self.client is not None
        if kind == ipc.OUTPUTS:
            outputs = ipc.decode(payload, EngineCoreOutputs)
            # Arrival and token times on this process's clock (the client's side), as
            # before; with statistics, the per-request intervals on the engine core's.
            result = self.output_processor.process_outputs(outputs.outputs, core_time=outputs.monotonic_timestamp)
            for request_output in result.request_outputs:
                queue = self._queues.get(request_output.request_id)
                if queue is not None:
                    queue.put_nowait(request_output)
            if result.reqs_to_abort:
                await self.client.abort_requests(result.reqs_to_abort)
            if self.stat_loggers:  # (none with log_stats off: nothing to compute the stats for)
                self._record(outputs.scheduler_stats,
                             iteration_stats(result.num_new_tokens, result.finished, result.first_tokens,
                                             result.inter_token_latencies))
        elif kind == ipc.REQUEST_ERROR:
            data = ipc.decode(payload)
            queue = self._slot_of.get(data["request_id"])
            if queue is not None:
                # (With an HTTP status the request failed in the engine; without, it was refused.)
                status = data.get("status")
                queue.put_nowait(InvalidRequestError(data["error"]) if status is None
                                 else RequestFailedError(data["error"], status))
        elif kind == ipc.UTILITY_RESULT:
            data = ipc.decode(payload)
            future = self._calls.get(data["call_id"])
            if future is not None and not future.done():
                if "error" in data:
                    error = {"ValueError": ValueError, "TypeError": TypeError,
                             "AttributeError": AttributeError}.get(data["kind"], RuntimeError)
                    future.set_exception(error(data["error"]))
                else:
                    future.set_result(data["result"])
        elif kind == ipc.DEAD:
            self._die(ipc.decode(payload)["error"])
            return False
        return True

    def _record(self, scheduler_stats: Any, stats: Any) -> None:
        self._interval_views.fill(scheduler_stats, stats)
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(scheduler_stats, stats, engine_idx=0)
            except Exception as e:  # a faulty plugin must not stop serving
                self._stat_logger_failed(stat_logger, e)

    def _stat_logger_failed(self, stat_logger: Any, error: Exception) -> None:
        """Log a stat logger's failure in ``record``: the first with its traceback, then
        the 10th, 100th, ... with the count (it fails on every batch of outputs)."""
        key = id(stat_logger)
        count = self._stat_logger_failures.get(key, 0) + 1
        self._stat_logger_failures[key] = count
        name = f"{type(stat_logger).__module__}.{type(stat_logger).__qualname__}"
        if count == 1:
            logger.warning("stat logger %s failed in record() (it keeps running; later failures are "
                           "counted)", name, exc_info=error)
        elif str(count).strip("0") == "1":
            logger.warning("stat logger %s failed in record() %d times; the last: %s: %s", name, count,
                           type(error).__name__, error)

    def _die(self, reason: str) -> None:
        if self.errored:
            return
        self.errored = True
        # The reason may carry a traceback (a worker's, after its message): the log gets
        # it, clients and /health only its first line, the exception's type and message.
        self.dead_reason = reason.strip().split("\n", 1)[0]
        logger.error("engine is dead: %s", reason)
        error = EngineDeadError(f"the engine died: {self.dead_reason}")
        for queue in self._queues.values():
            queue.put_nowait(error)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        if self.dead_event is not None:
            self.dead_event.set()

    async def _log_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.log_interval)
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger.log()
                except Exception:  # a faulty plugin must not stop the others
                    logger.warning("stat logger %r failed in log()", stat_logger, exc_info=True)
