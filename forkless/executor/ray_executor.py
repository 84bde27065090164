"""The Ray executor: one Ray actor per rank, in a placement group (``--distributed-executor-backend ray``).

``forkless serve`` on the head node is all a user runs. The engine core connects to a Ray
cluster (``RAY_ADDRESS``; else the latest one ``ray start`` started on this machine; else
it starts a local one and stops it at shutdown), reserves one bundle per rank in a placement
group (``{"CPU": 1}``, or ``{<Platform.ray_device_key>: 1}`` such as ``{"GPU": 1}``;
``FORKLESS_RAY_PLACEMENT_STRATEGY``, ``PACK`` by default, may spread them over nodes) and
starts one actor in each bundle. Each actor then does what a worker process of the ``mp``
executor does: it takes the engine core's ``FORKLESS_*`` variables (and the platform's
``additional_env_vars``), loads the general plugins, sets the torch threads and builds the
platform's worker with ``(config, rank, local_rank, distributed_init_method)``.

Invariants:
    * Ray is imported by this module only: forkless imports without it, and choosing
      ``ray`` without it installed fails at startup with the ``pip install`` to run.
    * Nothing of forkless's is pickled: the configuration and each step cross to an actor
      as msgpack bytes (``forkless.protocol.ipc``), decoded there; an actor answers
      ``(kind, msgpack bytes)``. Ray pickles only those bytes, ints and strings.
    * Ranks: those on the engine core's node come first (rank 0 there when a bundle is),
      then node by node. ``local_rank`` counts a rank's place on its node; with a device
      resource, every actor of a node sees all the devices given to that node's actors
      (``Platform.device_control_env_var``) and ``local_rank`` indexes its own. The
      rendezvous is ``tcp://<rank 0's node IP>:<a port free there>``.
    * Calls go to every rank and are awaited on all of them together: an actor that dies
      (its process killed, its node gone) fails the call in flight within a fraction of a
      second with :class:`WorkerDiedError` naming its rank, pid and node, even while the
      other ranks wait for it in a collective. Before raising, the executor kills the
      other actors and removes the placement group: the engine core may exit without
      calling :meth:`RayExecutor.shutdown`.
    * An actor that dies while no call is in flight (the engine idle) is found by a
      watch thread that pings every actor each second then, and reported to the failure
      callback (:meth:`RayExecutor.register_failure_callback`) within a few seconds; the
      engine core then fails as for a failed step. The watch only reports; releasing
      is left to the engine core's shutdown.
    * Async scheduling keeps the ``mp`` executor's protocol: ``execute_model_async`` sends
      ``launch(seq, step)`` to every actor, which launches the step and only then finishes
      the one before it (so a device never waits for the host) and returns that one's
      output: while steps overlap, ``collect(seq)`` reads step ``seq + 1``'s launch, one
      Ray task per step. Only the newest step is asked for on its own (``result(seq)``,
      which finishes it). Ray runs a (synchronous) actor's tasks one at a time in the
      order one caller submitted them, which is what keeps steps in order. Steps are
      collected once each, in launch order; synchronous calls are refused while steps are
      uncollected. A step launched with ``defer_sampling`` is sampled by a ``sample(seq,
      bitmask)`` task that the engine core sends before the next launch (not awaited: a
      failure is that step's answer).
    * Shutdown: each actor shuts its worker down, then is killed; the placement group is
      removed; this process leaves Ray if it joined it here. The actors and the placement
      group belong to this process's Ray job, so Ray removes them itself if the engine
      core is killed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # the extra is optional: say how to get it
    raise ImportError("--distributed-executor-backend ray needs Ray: pip install 'forkless[ray]' "
                      f"(ray>=2.40) ({exc})") from exc

from forkless import envs
from forkless.executor.multiproc import (RankedWorkersExecutor, StepHandle, WorkerDiedError, _build_worker,
                                         _error_payload, _prepare_process, _run_call)
from forkless.logger import init_logger
from forkless.protocol import ipc
from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from forkless.config import EngineConfig

logger = init_logger("forkless.executor.ray")

_OK = b"ok"
_ERROR = b"error"
_STEP_OK = b"step_ok"
_STEP_ERROR = b"step_error"
_POLL_S = 0.1
_STARTUP_TIMEOUT_S = 900.0
# How often startup says what the placement group still waits for.
_PLACEMENT_WARN_S = 30.0
_HEALTH_TIMEOUT_S = 30.0
# How often the watch thread pings idle actors (see the module).
_WATCH_INTERVAL_S = 1.0
_SHUTDOWN_WAIT_S = 10.0
# Steps bigger than this go to the object store once instead of once per actor.
_INLINE_BYTES = 100_000
# The object store of a Ray instance this executor starts itself: steps and replies are
# small, and Ray's default (30 % of memory) would claim /dev/shm for nothing.
_LOCAL_OBJECT_STORE_BYTES = 128 << 20


class RayWorkerActor:
    """One rank's worker inside a Ray actor; only :class:`RayExecutor` calls it.

    Created empty (Ray places it first); :meth:`start` builds the worker once the executor
    has chosen its rank and the rendezvous.
    """

    def __init__(self) -> None:
        self.worker: Any = None
        self.rank = -1
        # Async steps: the one launched and not finished, and finished outputs by seq.
        self.pending: tuple[int, Any] | None = None
        self.done: dict[int, tuple[bytes, bytes]] = {}

    def node_info(self) -> dict[str, Any]:
        """Where this actor runs: node id and IP, pid, and the device ids Ray gave it."""
        context = ray.get_runtime_context()
        devices = {key: [str(i) for i in ids] for key, ids in context.get_accelerator_ids().items()}
        return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "devices": devices}

    def free_port(self) -> int:
        """A TCP port free on this node, for the rendezvous of the ranks."""
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def start(self, config_bytes: bytes, rank: int, local_rank: int, init_method: str | None,
              env: dict[str, str]) -> tuple[bytes, bytes]:
        """Build the worker as an ``mp`` worker process does.

        Args:
            config_bytes: The engine configuration, msgpack.
            rank: This worker's global rank.
            local_rank: Its device index on this node.
            init_method: The ranks' rendezvous address (``None`` for a single worker).
            env: Variables of the engine core's to set here first (``FORKLESS_*``...).

        Returns:
            ``(READY, {pid, rank, async_scheduling})`` or ``(FAILED, {error, traceback})``.
        """
        os.environ.update(env)  # before anything reads them: plugins, platform, threads
        try:
            _prepare_process()
            worker, ready = _build_worker(config_bytes, rank, local_rank, init_method)
        except Exception as exc:
            return ipc.FAILED, ipc.encode(_error_payload(exc))
        self.worker, self.rank = worker, rank
        return ipc.READY, ipc.encode(ready)

    def call(self, method: str, payload: bytes) -> tuple[bytes, bytes]:
        """Run one synchronous worker method; ``(ok, result)`` or ``(error, {error, traceback})``."""
        self._finish_pending()  # the executor never interleaves calls with steps; keep order if it did
        try:
            return _OK, ipc.encode(_run_call(self.worker, method, payload))
        except Exception as exc:
            return _ERROR, ipc.encode(_error_payload(exc))

    def launch(self, seq: int, payload: bytes) -> tuple[bytes, bytes] | None:
        """Launch async step ``seq``, then finish the one before it.

        Returns:
            Step ``seq - 1``'s output when it was not handed out yet (the executor
            collects it from this task), else ``None``.
        """
        try:
            launched, error = self.worker.execute_model_async(ipc.decode(payload, SchedulerOutput)), None
        except Exception as exc:
            launched, error = None, _error_payload(exc)
        self._finish_pending()
        if error is not None:
            self.done[seq] = (_STEP_ERROR, ipc.encode(error))
        else:
            self.pending = (seq, launched)
        return self.done.pop(seq - 1, None)

    def sample(self, seq: int, grammar_bitmask: bytes | bytearray | None) -> None:
        """Sample async step ``seq``, launched with ``defer_sampling`` (a failure is that
        step's answer)."""
        if self.pending is None or self.pending[0] != seq:
            self.done[seq] = (_STEP_ERROR, ipc.encode({
                "error": f"RuntimeError: worker {self.rank} has no step {seq} in flight to sample", "traceback": ""}))
            return
        try:
            self.worker.sample_deferred(self.pending[1], grammar_bitmask)
        except Exception as exc:
            self.pending = None
            self.done[seq] = (_STEP_ERROR, ipc.encode(_error_payload(exc)))

    def result(self, seq: int) -> tuple[bytes, bytes]:
        """Step ``seq``'s output, finishing it if no newer step did: ``(step_ok|step_error, ...)``."""
        if seq not in self.done and self.pending is not None and self.pending[0] == seq:
            self._finish_pending()
        if seq not in self.done:
            return _STEP_ERROR, ipc.encode({"error": f"RuntimeError: worker {self.rank} has no step {seq}",
                                            "traceback": ""})
        return self.done.pop(seq)

    def _finish_pending(self) -> None:
        if self.pending is None:
            return
        (seq, handle), self.pending = self.pending, None
        try:
            self.done[seq] = (_STEP_OK, ipc.encode(self.worker.collect(handle)))
        except Exception as exc:
            self.done[seq] = (_STEP_ERROR, ipc.encode(_error_payload(exc)))

    def ping(self) -> bool:
        """Answered while the actor lives (check_health when no step is in flight)."""
        return self.worker is not None

    def shutdown(self) -> None:
        """Free the worker (a step in flight is dropped: its output has no reader)."""
        self.pending = None
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None


class _ActorWatch:
    """A daemon thread that pings the executor's actors while nothing is in flight and
    reports the first one found dead to the failure callback, once (at registration if
    it died before). It holds the executor weakly: its finalizer must still run."""

    def __init__(self, executor: RayExecutor) -> None:
        self._executor = weakref.ref(executor)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._error: WorkerDiedError | None = None
        self._callback: Callable[[BaseException], None] | None = None
        threading.Thread(target=self._run, name="forkless-ray-watch", daemon=True).start()

    def _run(self) -> None:
        while not self.stopping.wait(_WATCH_INTERVAL_S):
            executor = self._executor()
            if executor is None:
                return
            error = executor._idle_death()
            del executor
            if error is not None and not self.stopping.is_set():
                with self._lock:
                    self._error, callback = error, self._callback
                if callback is not None:
                    callback(error)
                return

    def set_callback(self, callback: Callable[[BaseException], None]) -> None:
        with self._lock:
            self._callback, error = callback, self._error
        if error is not None:
            callback(error)


class RayExecutor(RankedWorkersExecutor):
    """Workers in Ray actors, one per rank (``config.parallel_config.world_size``)."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.world_size = config.parallel_config.world_size
        self.actors: list[Any] = []  # by rank
        self.actor_info: list[dict[str, Any]] = []  # by rank: node_id, ip, pid, devices
        self.placement_group: Any = None
        self._joined_ray = False  # whether this executor called ray.init (it leaves at shutdown)
        self._dead: WorkerDiedError | None = None
        self._closed = False
        self._async_ok = True
        self._next_seq = 0
        self._in_flight: deque[int] = deque()
        self._launched: list[Any] = []  # the refs of the last async launch, one per rank
        # seq -> the launch refs (of step seq + 1) that carry step seq's output.
        self._carriers: dict[int, list[Any]] = {}
        self._watch: _ActorWatch | None = None
        try:
            self._connect()
            self._start()
        except BaseException:
            self.shutdown()
            raise
        self._watch = _ActorWatch(self)

    def register_failure_callback(self, callback: Callable[[BaseException], None]) -> None:
        """See :meth:`Executor.register_failure_callback`: ``callback`` is called from the
        watch thread when it finds an actor dead while the engine was idle."""
        if self._watch is not None:
            self._watch.set_callback(callback)

    def _idle_death(self) -> WorkerDiedError | None:
        """From the watch thread: the error naming an actor found dead by a ping, or
        ``None`` (all answered, a call or a step is in flight, or the executor is done).
        A ping that waits behind a call that started meanwhile counts as alive."""
        actors = list(self.actors)
        if self._closed or self._dead is not None or not actors or self._in_flight:
            return None
        refs = [actor.ping.remote() for actor in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_HEALTH_TIMEOUT_S)
        for rank, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if self._closed or self._dead is not None:  # (shut down, or the main thread saw it first)
                    return None
                error = self._death_error(rank, exc, starting=False)
                logger.error("%s", error)
                return error
        return None

    # -- startup ---------------------------------------------------------------------
    def _connect(self) -> None:
        if ray.is_initialized():
            return  # the embedding program joined a cluster already: use it, leave it joined
        common = {"logging_level": logging.WARNING, "log_to_driver": True}
        # Where ray.init() would go: RAY_ADDRESS, else the latest cluster `ray start`
        # started on this machine, else (None) a local instance of its own. Asked first
        # because only a local start takes the object store's size.
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address(None)
        except ImportError:  # a Ray that moved it: let ray.init() decide alone
            address = "found by ray.init()"
        if address is None:
            logger.info("no Ray cluster to join (RAY_ADDRESS is unset and `ray start` started none here): "
                        "starting a local one")
            ray.init(address="local", include_dashboard=False, object_store_memory=_LOCAL_OBJECT_STORE_BYTES,
                     **common)
        else:
            ray.init(**common)
        self._joined_ray = True

    def _start(self) -> None:
        from forkless.platforms import current_platform

        device_key = current_platform.ray_device_key or "CPU"
        bundles = [{device_key: 1.0} for _ in range(self.world_size)]
        strategy = envs.FORKLESS_RAY_PLACEMENT_STRATEGY
        self.placement_group = placement_group(bundles, strategy=strategy)
        self._wait_for_placement(bundles, strategy)
        if device_key == "CPU":
            options: dict[str, Any] = {"num_cpus": 1}
        elif device_key == "GPU":
            options = {"num_cpus": 0, "num_gpus": 1}
        else:
            options = {"num_cpus": 0, "resources": {device_key: 1}}
        actor_cls = ray.remote(**options)(RayWorkerActor)
        created = [actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group, placement_group_bundle_index=i)).remote()
            for i in range(self.world_size)]
        self.actors = created  # killed at shutdown even if startup fails below
        infos = self._gather([a.node_info.remote() for a in created], "node_info", _STARTUP_TIMEOUT_S, True)
        # Ranks: the engine core's node first, then node by node (bundle order within one).
        here = ray.get_runtime_context().get_node_id()
        order = sorted(range(self.world_size), key=lambda i: (infos[i]["node_id"] != here, infos[i]["node_id"], i))
        self.actors = [created[i] for i in order]
        self.actor_info = [infos[i] for i in order]
        for rank, info in enumerate(self.actor_info):
            logger.info("worker %d: Ray actor pid %d on node %s (%s)", rank, info["pid"], info["ip"],
                        info["node_id"][:12])
        init_method = None  # one worker joins no one (as with mp)
        if self.world_size > 1:
            port = self._gather([self.actors[0].free_port.remote()], "free_port", _STARTUP_TIMEOUT_S, True)[0]
            ip = self.actor_info[0]["ip"]
            init_method = f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"
        config_bytes = ipc.encode(self.config.to_builtins())
        refs = [actor.start.remote(config_bytes, rank, local_rank, init_method, env)
                for rank, (actor, local_rank, env) in enumerate(zip(self.actors, *self._placement_env(
                    device_key, current_platform.device_control_env_var, current_platform.additional_env_vars)))]
        def started(rank: int, answer: tuple[bytes, bytes]) -> None:
            # As each answers: the other ranks may wait for a failed one at the rendezvous.
            kind, payload = answer
            data = ipc.decode(payload)
            if kind == ipc.FAILED:
                raise ipc.ChildStartError(f"worker {rank} failed to start: {data['error']}", data["traceback"])
            self._async_ok = self._async_ok and bool(data["async_scheduling"])

        self._gather(refs, "start", _STARTUP_TIMEOUT_S, True, check=started)

    def _wait_for_placement(self, bundles: list[dict[str, float]], strategy: str) -> None:
        """Wait for the placement group (an autoscaling cluster may add nodes meanwhile),
        saying what is missing every so often.

        Raises:
            RuntimeError: Not placed within ``FORKLESS_RAY_PLACEMENT_TIMEOUT`` seconds.
        """
        timeout = envs.FORKLESS_RAY_PLACEMENT_TIMEOUT
        ready_ref = self.placement_group.ready()
        start = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - start)
            if ray.wait([ready_ref], timeout=max(0.0, min(_PLACEMENT_WARN_S, left)))[0]:
                return
            nodes = len([n for n in ray.nodes() if n.get("Alive")])
            what = (f"{self.world_size} bundle(s) {bundles[0]} ({strategy}) on a cluster of {nodes} node(s) "
                    f"with {ray.cluster_resources()}, {ray.available_resources()} free")
            if time.monotonic() - start >= timeout:
                raise RuntimeError(f"the Ray cluster could not place {what} within {timeout:g} s "
                                   "(FORKLESS_RAY_PLACEMENT_TIMEOUT)")
            logger.warning("still waiting for Ray to place %s", what)

    def _placement_env(self, device_key: str, device_var: str,
                       additional: list[str] | tuple[str, ...]) -> tuple[list[int], list[dict[str, str]]]:
        """Each rank's ``local_rank`` and the variables its actor sets before building the worker."""
        base = envs.forwarded_environment(additional)
        local_ranks: list[int] = []
        envs_by_rank: list[dict[str, str]] = []
        for rank, info in enumerate(self.actor_info):
            same_node = [i for i in self.actor_info if i["node_id"] == info["node_id"]]
            env = dict(base)
            own = info["devices"].get(device_key, [])
            if device_key != "CPU" and device_var and own:
                # Every actor of the node sees the node's devices (peer access between
                # ranks); local_rank picks its own.
                node_ids = sorted({d for i in same_node for d in i["devices"].get(device_key, [])},
                                  key=lambda d: (len(d), d))
                env[device_var] = ",".join(node_ids)
                local_ranks.append(node_ids.index(own[0]))
            else:  # the rank's place among its node's ranks
                local_ranks.append(sum(i["node_id"] == info["node_id"] for i in self.actor_info[:rank]))
            envs_by_rank.append(env)
        return local_ranks, envs_by_rank

    # -- calls -----------------------------------------------------------------------
    def _gather(self, refs: list[Any], what: str, timeout_s: float | None = None, starting: bool = False,
                check: Callable[[int, Any], None] | None = None) -> list[Any]:
        """The results of one task per rank, failing as soon as any rank's actor dies
        (or ``check(rank, result)``, called as each arrives, raises).

        Raises:
            WorkerDiedError: An actor died (the executor has released everything).
            TimeoutError: ``timeout_s`` passed.
        """
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        waiting = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1, timeout=_POLL_S)
            for ref in ready:
                results[rank_of[ref]] = self._get(rank_of[ref], ref, what, starting)
                if check is not None:
                    check(rank_of[ref], results[rank_of[ref]])
            if deadline is not None and waiting and time.monotonic() > deadline:
                ranks = sorted(rank_of[r] for r in waiting)
                raise TimeoutError(f"worker(s) {ranks} did not answer {what} within {timeout_s:.0f} s")
        return results

    def _get(self, rank: int, ref: Any, what: str, starting: bool = False) -> Any:
        """One rank's finished task's result; its actor's death as :class:`WorkerDiedError`."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise self._died(rank, exc, starting) from None
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"worker {rank}: {what} failed in its Ray actor: {exc}") from None

    def _death_error(self, rank: int, exc: Exception, starting: bool) -> WorkerDiedError:
        """The error naming rank ``rank``'s actor, which ``exc`` says died."""
        info = self.actor_info[rank] if rank < len(self.actor_info) else {}
        where = f"pid {info['pid']} on node {info['ip']}" if info else "not placed yet"
        when = "while starting" if starting else "while the engine was running"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return WorkerDiedError(f"worker {rank} (Ray actor, {where}) died {when}: {reason}")

    def _died(self, rank: int, exc: Exception, starting: bool) -> WorkerDiedError:
        error = self._death_error(rank, exc, starting)
        logger.error("%s; stopping the other workers", error)
        self._dead = error
        # The engine core may exit without shutdown(): leave nothing behind. No polite
        # shutdown: the other ranks may be waiting for the dead one in a collective.
        self._release(graceful=False)
        return error

    def _usable(self) -> None:
        if self._dead is not None:
            raise self._dead
        if self._closed:
            raise RuntimeError("the Ray executor is shut down")

    def _step_payload(self, scheduler_output: SchedulerOutput) -> Any:
        data = ipc.encode(scheduler_output)
        return ray.put(data) if self.world_size > 1 and len(data) > _INLINE_BYTES else data

    def _call(self, method: str, *args: Any, payload: Any = None, timeout_s: float | None = None) -> list[bytes]:
        """Run a worker method on every rank; the replies by rank.

        Raises:
            RuntimeError: A worker raised (its message and traceback), or async steps
                are uncollected.
            WorkerDiedError: An actor died.
        """
        self._usable()
        if self._in_flight:
            raise RuntimeError(f"{method} called while async steps {list(self._in_flight)} are not "
                               "collected: collect() them first")
        data = ipc.encode(list(args)) if payload is None else payload
        replies = self._gather([a.call.remote(method, data) for a in self.actors], method, timeout_s)
        for rank, (kind, reply) in enumerate(replies):
            if kind == _ERROR:
                err = ipc.decode(reply)
                raise RuntimeError(f"worker {rank}: {method} failed: {err['error']}\n{err['traceback']}")
        return [reply for _, reply in replies]

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Launch one step on every rank without waiting (see the module docstring).

        Returns:
            The handle to pass to :meth:`collect`, in launch order.
        """
        self._usable()
        seq = self._next_seq
        self._next_seq += 1
        data = self._step_payload(scheduler_output)
        carries = bool(self._in_flight) and self._in_flight[-1] == seq - 1
        self._in_flight.append(seq)
        self._launched = [a.launch.remote(seq, data) for a in self.actors]
        if carries:  # step seq - 1 is uncollected: this launch finishes it and returns its output
            self._carriers[seq - 1] = self._launched
        return StepHandle(seq, id(self))

    def collect(self, pending: StepHandle) -> ModelRunnerOutput:
        """The output of the oldest uncollected step, which ``pending`` must name.

        Raises:
            RuntimeError: ``pending`` is not that step (collected already, out of order,
                another executor's), or a worker raised in the step.
            WorkerDiedError: An actor died before answering.
        """
        self._usable()
        if not isinstance(pending, StepHandle) or pending.owner != id(self):
            raise RuntimeError(f"collect({pending!r}): not a step handle of this executor")
        seq = pending.seq
        if not self._in_flight or self._in_flight[0] != seq:
            oldest = self._in_flight[0] if self._in_flight else None
            raise RuntimeError(f"collect(step {seq}): steps are collected once each in launch order; "
                               f"the oldest uncollected step is {oldest}")
        self._in_flight.popleft()
        # One Ray task per step while steps overlap: the next step's launch carries this
        # one's output; only the newest step is asked for on its own.
        refs = self._carriers.pop(seq, None) or [a.result.remote(seq) for a in self.actors]
        replies = self._gather(refs, f"step {seq}")
        for rank, answer in enumerate(replies):
            if answer is None:
                raise RuntimeError(f"worker {rank} had no output for step {seq}: the step protocol is out of step")
            kind, reply = answer
            if kind == _STEP_ERROR:
                err = ipc.decode(reply)
                raise RuntimeError(f"worker {rank}: step {seq} (execute_model_async) failed: "
                                   f"{err['error']}\n{err['traceback']}")
        return self._output_from([reply for _, reply in replies])

    def sample_deferred(self, pending: StepHandle, grammar_bitmask: bytes | bytearray | None) -> None:
        """Have every rank sample ``pending``'s step with ``grammar_bitmask``; not awaited:
        the actors run it before the next launch, and its failure comes with the step's
        output at :meth:`collect`.

        Raises:
            RuntimeError: ``pending`` is not an uncollected step of this executor.
        """
        self._usable()
        self._check_uncollected(pending)
        for actor in self.actors:
            actor.sample.remote(pending.seq, grammar_bitmask)

    def check_health(self) -> None:
        """Raise if an actor is dead: a launch that failed, else a ping of every rank."""
        self._usable()
        if self._in_flight:
            # Each actor is busy with steps: a ping would wait behind them. A dead actor's
            # launch is already answered with its death.
            ready, _ = ray.wait(self._launched, num_returns=len(self._launched), timeout=0)
            for rank, ref in enumerate(self._launched):
                if ref in ready:
                    self._get(rank, ref, "check_health")
            return
        self._gather([a.ping.remote() for a in self.actors], "check_health", _HEALTH_TIMEOUT_S)

    # -- shutdown --------------------------------------------------------------------
    def _release(self, graceful: bool = True) -> None:
        """Kill the actors (after stopping their workers when ``graceful``) and remove the
        placement group; best effort."""
        actors, self.actors = self.actors, []
        self._in_flight.clear()
        self._launched = []
        self._carriers.clear()
        if actors and graceful:
            try:
                ray.wait([a.shutdown.remote() for a in actors], num_returns=len(actors), timeout=_SHUTDOWN_WAIT_S)
            except Exception:  # a dead actor or a lost cluster: killing is all that is left
                pass
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        pg, self.placement_group = self.placement_group, None
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:
                pass

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.stopping.set()
        self._release()
        if self._joined_ray:
            self._joined_ray = False
            ray.shutdown()  # leaves the cluster; stops it if it was started here
