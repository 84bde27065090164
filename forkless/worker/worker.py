"""The worker: one device, one model runner (``Platform.worker_cls`` points here by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from forkless.logger import init_logger
from forkless.worker.kv_budget import kv_budget_bytes, num_blocks_for

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput
    from forkless.worker.model_runner import ModelRunner

logger = init_logger(__name__)


class Worker:
    """Drives one device for the executor.

    Lifecycle: ``init_device()``, ``load_model()``, ``determine_num_blocks()``,
    ``initialize_cache(n)``, then ``execute_model(...)`` per step, ``shutdown()``.

    Args:
        config: The engine configuration.
        rank: Global rank of this worker.
        local_rank: Device index on this host.
        distributed_init_method: Rendezvous address (``tcp://host:port``) of the
            engine's workers; unused by a single worker.
    """

    def __init__(
        self,
        config: EngineConfig,
        rank: int = 0,
        local_rank: int = 0,
        distributed_init_method: str | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.local_rank = local_rank
        self.distributed_init_method = distributed_init_method
        self.device: torch.device | None = None
        self.model_runner: ModelRunner | None = None
        # Sleep mode: the KV-cache blocks to allocate again at wake-up, and what sleeps.
        self._num_blocks: int | None = None
        self._sleeping: set[str] = set()
        # LLM.start_profile(): the torch profiler running, until stop_profile().
        self._profiler: torch.profiler.profile | None = None

    def init_device(self) -> None:
        """Select the device, apply ``--num-threads``, seed the global generators, and,
        with several workers, join them (``forkless.distributed.parallel_state``: the
        process groups and the platform's device communicator)."""
        from forkless.platforms import current_platform

        self.device = current_platform.torch_device(self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        parallel = self.config.parallel_config
        # A worker process already runs FORKLESS_WORKER_THREADS threads (by default its
        # share of the host's cores: the workers of one host share them).
        threads = self.config.device_config.num_threads
        if threads is not None:
            torch.set_num_threads(threads)
        if parallel.world_size > 1:
            from forkless.distributed.parallel_state import init_parallel_state

            init_parallel_state(world_size=parallel.world_size, rank=self.rank,
                                tensor_parallel_size=parallel.tensor_parallel_size,
                                pipeline_parallel_size=parallel.pipeline_parallel_size,
                                init_method=self.distributed_init_method, device=self.device,
                                dist_backend=current_platform.dist_backend,
                                communicator=parallel.device_communicator_cls)
        current_platform.seed_everything(self.config.device_config.seed)

    def load_model(self) -> None:
        """Build the model runner (loads the weights and the logits processors)."""
        from forkless.worker.model_runner import ModelRunner

        assert self.device is not None, "call init_device() first"
        if self.config.model_config.pooler_config is not None:  # --runner pooling
            from forkless.worker.pooling_runner import PoolingModelRunner

            self.model_runner = PoolingModelRunner(self.config, self.device)
            return
        self.model_runner = ModelRunner(self.config, self.device)

    def determine_num_blocks(self) -> int:
        """KV-cache blocks this worker can hold.

        Raises:
            ValueError: The budget cannot hold one ``max_model_len`` sequence.
        """
        from forkless.platforms import current_platform

        runner = self._runner()
        assert self.device is not None
        used = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            runner.profile_run()
            torch.cuda.synchronize(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            # Memory in use now plus the activation peak the profile reached above it.
            peak_extra = torch.cuda.max_memory_allocated(self.device) - torch.cuda.memory_allocated(self.device)
            used = total - free + peak_extra
        else:
            free = current_platform.free_memory_bytes(self.local_rank)
            total = current_platform.total_memory_bytes(self.local_rank)
        per_block = runner.bytes_per_block
        budget = kv_budget_bytes(
            self.config,
            device_type=self.device.type,
            free_bytes=free,
            total_bytes=total,
            used_bytes=used,
            bytes_per_block=per_block,
        )
        # A draft model's scratch blocks come out of the same budget (its per-block share
        # is in per_block already).
        num_blocks = num_blocks_for(budget, per_block, self.config, reserved_bytes=runner.kv_reserved_bytes)
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB)",
            num_blocks, self.config.cache_config.block_size, num_blocks * per_block / (1 << 20),
        )
        return num_blocks

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache."""
        self._runner().initialize_cache(num_blocks)
        self._num_blocks = num_blocks

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode: free the KV cache, whose contents are forgotten; level 2 frees
        the model's weights too. The engine core calls it with no request in flight and its
        prefix cache reset (:meth:`forkless.engine.core.EngineCore.sleep`).

        Level 1 keeps the weights where they are: vLLM offloads them from the GPU to host
        memory, which forkless does not (on the CPU they are there already). Level 2 drops
        the model runner, and :meth:`wake_up` builds it again from the model's files, where
        vLLM leaves the woken weights for the caller to load.

        Raises:
            ValueError: ``level`` is not 1 or 2.
            RuntimeError: The worker sleeps already, or its KV cache feeds a KV connector
                or a draft model (their sleep is not implemented).
        """
        if isinstance(level, bool) or level not in (1, 2):
            raise ValueError(f"sleep level={level!r} is invalid: expected 1 (free the KV cache) or 2 "
                             "(the KV cache and the weights)")
        if self._sleeping:
            raise RuntimeError(f"the worker sleeps already ({', '.join(sorted(self._sleeping))}): wake_up() first")
        self._runner().release_cache()
        self._sleeping = {"kv_cache"}
        if level == 2:
            self.model_runner = None
            self._sleeping.add("weights")
        import gc

        gc.collect()  # the cache's pages go back now, not at the next collection
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Allocate again what :meth:`sleep` freed: ``tags`` names which of ``"weights"``
        and ``"kv_cache"`` (``None``: all that sleeps). The KV cache comes back zeroed,
        with as many blocks as before; weights come back from the model's files.

        Raises:
            ValueError: A tag other than those two.
            RuntimeError: The KV cache is woken while the weights still sleep.
        """
        wanted = set(self._sleeping if tags is None else tags)
        unknown = sorted(wanted - {"weights", "kv_cache"})
        if unknown:
            raise ValueError(f"wake_up tags {unknown} are invalid: expected 'weights' and/or 'kv_cache'")
        wanted &= self._sleeping
        if "weights" in wanted:
            self.load_model()
            self._sleeping.discard("weights")
        if "kv_cache" in wanted:
            if "weights" in self._sleeping:
                raise RuntimeError("wake_up(['kv_cache']) while the weights sleep: wake 'weights' first "
                                   "(or both, tags=None)")
            assert self._num_blocks is not None
            self._runner().initialize_cache(self._num_blocks)
            self._sleeping.discard("kv_cache")

    def start_profile(self, trace_dir: str, options: dict[str, bool] | None = None) -> None:
        """Start torch's profiler on this worker (vLLM's ``LLM.start_profile``): CPU
        activity, and CUDA kernels on a GPU, until :meth:`stop_profile` writes the trace.

        Args:
            trace_dir: Where :meth:`stop_profile` writes this rank's trace
                (``rank<N>.*.pt.trace.json``, for Perfetto or TensorBoard).
            options: ``torch.profiler.profile`` flags (``record_shapes``,
                ``profile_memory``, ``with_stack``, ``with_flops``).

        Raises:
            RuntimeError: The profiler runs already.
        """
        if self._profiler is not None:
            raise RuntimeError("start_profile(): the profiler runs already: call stop_profile() first")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device is not None and self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        handler = torch.profiler.tensorboard_trace_handler(trace_dir, worker_name=f"rank{self.rank}")
        profiler = torch.profiler.profile(activities=activities, on_trace_ready=handler, **(options or {}))
        profiler.start()
        self._profiler = profiler

    def stop_profile(self) -> None:
        """Stop the profiler :meth:`start_profile` started and write its trace.

        Raises:
            RuntimeError: The profiler does not run.
        """
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            raise RuntimeError("stop_profile(): the profiler does not run: call start_profile() first")
        profiler.stop()

    def is_sleeping(self) -> bool:
        """Whether anything sleeps (:meth:`sleep`)."""
        return bool(self._sleeping)

    def get_model(self) -> torch.nn.Module:
        """The model this worker runs (vLLM's ``get_model``).

        Raises:
            RuntimeError: No model is loaded (before ``load_model()``, after ``shutdown()``,
                or during a level-2 sleep).
        """
        return self._runner().model

    def apply_model(self, func: Callable[[torch.nn.Module], Any]) -> Any:
        """``func(model)`` on this worker's model (vLLM's ``apply_model``); for
        ``LLM.apply_model``, in process only (a callable does not cross processes)."""
        return func(self.get_model())

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step (see :meth:`ModelRunner.execute_model`)."""
        return self._runner().execute_model(scheduler_output)

    @property
    def supports_async_scheduling(self) -> bool:
        """Whether :meth:`execute_model_async` / :meth:`collect` may overlap steps."""
        return self._runner().supports_async_scheduling

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Any:
        """Launch one step (see :meth:`ModelRunner.execute_model_async`)."""
        return self._runner().execute_model_async(scheduler_output)

    def sample_deferred(self, pending: Any, grammar_bitmask: bytes | bytearray | None) -> None:
        """Sample a step launched with ``defer_sampling`` (see :meth:`ModelRunner.sample_deferred`)."""
        self._runner().sample_deferred(pending, grammar_bitmask)

    def step_done(self, pending: Any) -> bool:
        """Whether :meth:`collect` of a launched step would not wait for the device."""
        return self._runner().step_done(pending)

    def collect(self, pending: Any) -> ModelRunnerOutput:
        """Wait for a launched step's tokens (see :meth:`ModelRunner.collect`)."""
        return self._runner().collect(pending)

    def allocate_host_buffer(self, nbytes: int) -> Any:
        """A writable host buffer of ``nbytes`` (any object with the buffer protocol) that
        this worker copies to its device without staging -- pinned memory on CUDA -- for
        an engine core in the same process to fill (the grammar bitmask); ``None`` where
        a plain buffer serves as well (the default on CPU)."""
        if self.device is None or self.device.type != "cuda":
            return None
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()

    def register_host_buffer(self, buffer: Any) -> Any:
        """Pin a writable host buffer made elsewhere (the engine core's shared memory, which
        a worker process maps) so that copies from it to the device need no staging.

        Returns:
            A handle for :meth:`unregister_host_buffer`, or ``None`` where nothing was
            pinned (not a CUDA device, or the driver refused: copies then stage as before).
        """
        if self.device is None or self.device.type != "cuda":
            return None
        import numpy as np

        array = np.frombuffer(buffer, dtype=np.uint8)
        try:
            # (A cudaError enum: int() is its code; 0 is success.)
            error: Any = int(torch.cuda.cudart().cudaHostRegister(array.ctypes.data, array.nbytes, 0))
        except (AttributeError, RuntimeError) as exc:  # a runtime without the call
            error = exc
        if error != 0:
            logger.warning("could not pin a shared host buffer of %d bytes (%s); its copies are staged",
                           array.nbytes, error)
            return None
        return array

    def unregister_host_buffer(self, handle: Any) -> None:
        """Unpin what :meth:`register_host_buffer` pinned (its copies have completed)."""
        torch.cuda.cudart().cudaHostUnregister(handle.ctypes.data)

    def wait_for_kv_connector_saves(self) -> None:
        """Let every save the KV connector's worker side started end (the engine core
        calls it between steps, before the connector's store is reset); nothing without
        a connector."""
        if self.model_runner is not None and self.model_runner.kv_connector is not None:
            self.model_runner.kv_connector.wait_for_pending_saves()

    def check_health(self) -> None:
        """Raise when the worker cannot run steps."""
        self._runner()

    def shutdown(self) -> None:
        """Free the model and the KV cache (after a KV connector's transfers end)."""
        if self.model_runner is not None and self.model_runner.kv_connector is not None:
            self.model_runner.kv_connector.shutdown()
        self.model_runner = None
        if self.config.parallel_config.world_size > 1:
            from forkless.distributed.parallel_state import destroy_parallel_state

            destroy_parallel_state()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _runner(self) -> ModelRunner:
        if self.model_runner is None:
            if "weights" in self._sleeping:
                raise RuntimeError("the worker sleeps (level 2): wake_up() first")
            raise RuntimeError("the worker has no model: call load_model() first (or it was shut down)")
        return self.model_runner


def call_worker_method(worker: Worker, method: str | Callable[..., Any], args: Sequence[Any] = (),
                       kwargs: dict[str, Any] | None = None) -> Any:
    """Run ``method`` on ``worker`` for ``collective_rpc``: the name of one of its public
    methods, or (in the worker's own process only) a callable taking the worker first.

    Raises:
        TypeError: ``method`` is neither; ``args`` is not a list or tuple, or ``kwargs``
            not a dict.
        AttributeError: The worker has no public method of that name.
    """
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"collective_rpc args must be a tuple or list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"collective_rpc kwargs must be a dict or None, got {type(kwargs).__name__}")
    if callable(method):
        return method(worker, *args, **(kwargs or {}))
    if not isinstance(method, str):
        raise TypeError(f"collective_rpc method must be a worker method's name or a callable, got "
                        f"{type(method).__name__}")
    target = None if method.startswith("_") else getattr(worker, method, None)
    if not callable(target):
        cls = type(worker)  # (not the instance: a property would run)
        public = sorted(n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n)))
        raise AttributeError(f"collective_rpc: {type(worker).__name__} has no public method {method!r}; "
                             f"it has: {', '.join(public)}")
    return target(*args, **(kwargs or {}))


def create_worker(config: EngineConfig, rank: int = 0, local_rank: int | None = None,
                  distributed_init_method: str | None = None) -> Worker:
    """Instantiate the platform's worker class (``config.parallel_config.worker_cls``,
    or ``current_platform.worker_cls`` while that is still ``"auto"``).

    With ``parallel_config.worker_extension_cls`` the class is extended with it
    (:func:`extend_worker_class`).

    Raises:
        TypeError: The class does not subclass :class:`Worker`, or the extension is not a
            class or clashes with it.
    """
    from forkless.platforms import current_platform
    from forkless.plugins import resolve_class

    path = config.parallel_config.worker_cls
    if path == "auto":  # a platform's check_and_update_config need not fill it in
        path = current_platform.worker_cls
    cls = resolve_class(path, Worker, "worker_cls")
    if config.parallel_config.worker_extension_cls:
        cls = extend_worker_class(cls, config.parallel_config.worker_extension_cls)
    return cls(config, rank=rank, local_rank=rank if local_rank is None else local_rank,
               distributed_init_method=distributed_init_method)


# (worker class, extension class) -> the extended class: one class per pair and process,
# so that engines of one process with the same pair share it.
_extended: dict[tuple[type, type], type] = {}


def extend_worker_class(worker_cls: type[Worker], extension: str | type) -> type[Worker]:
    """``worker_cls`` with the methods of ``extension`` (vLLM's ``worker_extension_cls``),
    for ``collective_rpc`` to call by name.

    vLLM appends the extension to the worker class's own bases, in place; here a subclass
    of both is made instead, so that the worker class stays as it was for other engines
    of the process (the in-process ``uni`` executor shares the caller's classes). As in
    vLLM, the worker's attributes come first and none of them may be redefined: the
    extension adds methods, it does not override the worker's.

    Args:
        worker_cls: The worker class.
        extension: A class path (``"pkg.module.Class"`` or ``"pkg.module:Class"``) or a class.

    Returns:
        The extended class (``worker_cls`` itself when it already derives from the extension).

    Raises:
        ValueError: ``extension`` is not a well-formed class path.
        PluginImportError: The path does not import.
        TypeError: ``extension`` is not a class, or defines a name the worker class has
            (the names are listed).
    """
    from forkless.plugins import resolve_class

    ext = resolve_class(extension, object, "worker_extension_cls")
    if issubclass(worker_cls, ext):
        return worker_cls
    key = (worker_cls, ext)
    if key not in _extended:
        names = [n for n in dir(ext) if not n.startswith("__")]
        clashes = sorted(n for n in names if hasattr(worker_cls, n))
        if clashes:
            raise TypeError(f"worker_extension_cls {ext.__module__}.{ext.__qualname__} defines "
                            f"{', '.join(clashes)}, which the worker class {worker_cls.__module__}."
                            f"{worker_cls.__qualname__} has already: an extension may only add names")
        methods = sorted(n for n in names if callable(getattr(ext, n)))
        _extended[key] = type(worker_cls.__name__, (worker_cls, ext),
                              {"__module__": worker_cls.__module__, "__qualname__": worker_cls.__qualname__})
        logger.info("worker class %s extended with %s: collective_rpc can call %s", worker_cls.__qualname__,
                    ext.__qualname__, ", ".join(methods) or "nothing (no methods)")
    return _extended[key]
