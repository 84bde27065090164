"""The grammars in a process of their own (with the ``mp`` executor, or ``FORKLESS_GRAMMAR_PROCESS=1``).

On the engine core's threads, the grammar work of a step (advancing each constrained
request's grammar over its new token, filling the next bitmask, compiling) takes the
interpreter's lock from the step loop between its C calls, and at batch 256 on a GPU the
step loop is what bounds the step (benchmarks/README.md, "Structured outputs"). Here a
child process holds the :class:`~forkless.structured_output.manager.StructuredOutputManager`
and fills the bitmask straight into the executor's shared segment, the one the workers
read; the engine core holds a :class:`GrammarProcessClient`, which has the manager's
methods and keeps the step loop's share of the work to a send and a receive.

With ``FORKLESS_GRAMMAR_PROCESSES=N`` there are N such processes, and the requests are
shared out among them by request id: a step's grammar work (advance and fill, which sit
on the chain from one step's tokens to the next step's sampling) is split N ways. Below,
"the process" is the one that holds the request in question.

Invariants:
    * A request belongs to one process for its whole life (``hash`` of its id, in the
      client's process), which receives every message about it. Every process gets every
      deferred fill (its own rows, maybe none) and answers it; a process writes only the
      rows of its own requests, and a row of one whose grammar is gone allows everything.
      Each process that fills a routed step sends its own ``sample`` message, with the
      number of parts, and a worker samples once all have come.
    * The process holds every grammar, backend and compilation; the client holds which
      requests have a grammar (``_grammars``), and for each the stop tokens that
      complete it where its backend tells completion from them
      (``completion_from_tokens``). Both drop a request at the same calls, so they agree
      on which requests hold a grammar, except for a refusal the process found and has
      not yet reported (the client learns it with the next fill's reply). Of a request
      still thinking (the manager's invariants), the client holds the token that ends its
      reasoning too (``_thinking``, from the ``compiled`` event), and sees it end in the
      same tokens the process does: its completion from the stop tokens reads only the
      tokens after that one.
    * Messages go one way on a PUSH socket per process and come back on one the
      processes share, and a process handles them in the order sent. ``fill`` (a
      deferred fill, carrying the advance of ``accept_early`` where it comes from there)
      is answered by ``filled``; ``fill_now`` and an ``accept`` that has to wait for the
      grammars by ``reply`` (one from each process asked); a handler's exception by
      ``error`` in their place, which the client raises. ``compiled`` events come
      whenever a compilation ends. Nothing else is answered.
    * A fill names the executor's segment and the bytes it may use: the process maps the
      segment by name (once, again when the name changes) and writes only those bytes.
      The client passes the executor a view of the same bytes once the fill is answered,
      so the workers read it only after the process wrote it, and the next fill starts
      only after the step that read it was collected (the manager's invariant).
    * Under ``defer_advance`` with every constrained row's backend telling completion
      from tokens, the client answers :meth:`accept` itself (complete: the last token is
      a stop token) and sends the tokens on; the process advances the grammars before
      the next fill. Refusals such an advance finds reach the client with that fill's
      reply and are reported by the next :meth:`accept`, as the manager reports them.
    * Where the executor gives a route to its workers (``Executor.deferred_sample_route``:
      ``mp``), a deferred fill names the step, and the process sends the workers its
      ``sample`` message as soon as the bitmask is written (a bitmask-less one if the fill
      failed), before it answers ``filled``: the step is sampled while the engine core is
      still busy with the step before's outputs and the next plan, and the engine core
      does not send it (:attr:`GrammarProcessClient.sample_sent`).
    * ``accept_early`` sends a collected step's tokens (those the scheduler keeps) and
      the next deferred fill before the scheduler applies the step; the ``accept`` that
      follows sends nothing but the finished requests (the process advanced them too),
      and tells completion from the stop tokens, as above.
    * Where the executor routes tokens (``Executor.routes_grammar_tokens``) and every
      constrained row's backend tells completion from tokens, a deferred plan names the
      processes' token sockets and a fill id (``SchedulerOutput.grammar_tokens_to``): the
      worker sends each process the step's tokens itself once it has them, without their
      trip through the engine core. Each routed step's tokens are taken by exactly one
      later message, sent before any other that concerns the grammars: the next deferred
      fill (``tokens_from``, sent before the step is collected) or ``consume``. Either
      carries the ids whose token the scheduler drops (requests preempted by the plan
      after the step): a process skips those, and requests it no longer holds.
    * The process exits on ``shutdown``, when the client is dropped without one or the
      interpreter exits (``ipc.release_with``), or when the engine core's process is gone.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import traceback
from collections import deque
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import msgspec
import zmq

from forkless.logger import init_logger
from forkless.protocol import ipc
from forkless.protocol.shared_memory import decode_grammar_tokens, sample_message
from forkless.sampling_params import StructuredOutputsParams
from forkless.structured_output.config import StructuredOutputsConfig
from forkless.structured_output.manager import grammar_tokens, mark_deferred
from forkless.tracing import StepTrace

if TYPE_CHECKING:
    from forkless.protocol.step import EngineCoreOutput, SchedulerOutput

# (Named, not __name__: the process runs this module as __main__.)
logger = init_logger("forkless.structured_output.process")

_SUBMIT, _FINISH, _ACCEPT, _FILL, _FILL_NOW, _SHUTDOWN = b"submit", b"finish", b"accept", b"fill", b"fill_now", b"stop"
_CONSUME = b"consume"
_COMPILED, _FILLED, _REPLY, _ERROR = b"compiled", b"filled", b"reply", b"error"
# How long the process sleeps on its socket between looks at the engine core's process
# (and, while something compiles, at the compilations).
_IDLE_POLL_MS, _COMPILING_POLL_MS = 1000, 2


class GrammarProcessClient:
    """The engine core's handle on the grammar process: the methods of
    :class:`~forkless.structured_output.manager.StructuredOutputManager`, the work done
    there. The process starts with the first constrained request.

    Args:
        config: The server's structured-output settings.
        tokenizer_path: Folder of the model's tokenizer.
        vocab_size: Width of the model's logits.
        eos_token_ids: The model's EOS ids.
        allocate_shared: ``Executor.allocate_shared_bitmask_buffer``.
        sample_route: ``Executor.deferred_sample_route``: where the process tells the
            workers to sample a deferred step once its bitmask is filled.
        num_processes: How many grammar processes share the requests
            (``FORKLESS_GRAMMAR_PROCESSES``; see the module's invariants).
        route_tokens: Whether deferred plans have the workers send their tokens to the
            processes (``Executor.routes_grammar_tokens``, where
            ``FORKLESS_GRAMMAR_ROUTE_TOKENS`` allows it).
    """

    def __init__(self, config: StructuredOutputsConfig, tokenizer_path: str, vocab_size: int,
                 eos_token_ids: list[int], allocate_shared: Callable[[int], tuple[str, Any] | None],
                 sample_route: Callable[[Any], tuple[int, list[str]] | None] = lambda pending: None,
                 num_processes: int = 1, route_tokens: bool = False) -> None:
        if num_processes < 1:
            raise ValueError(f"num_processes must be at least 1, got {num_processes}")
        self._args = (dataclasses.asdict(config), tokenizer_path, vocab_size, list(eos_token_ids))
        self._words = (vocab_size + 31) // 32
        self._allocate_shared = allocate_shared
        self._sample_route = sample_route
        self.num_processes = num_processes
        self.route_tokens = route_tokens
        # The processes' token sockets (route_tokens), and the next routed plan's fill id.
        self._token_addresses: list[str] = []
        self._next_fill_id = 0
        # A routed step's tokens for the deferred fill to come (fill id, void ids), where it
        # could not go out before the step was collected; and the most bytes a view has had
        # (a larger one grows the executor's segment, whose old name the workers may still
        # have to map for the step in flight).
        self._tokens_from: tuple[int, list[str]] | None = None
        self._view_bytes = 0
        # The request ids of the last deferred fill's rows (every process has its part).
        self._fill_ids: list[str] | None = None
        #: Whether the deferred fill last started has the workers sample its step itself
        #: (then the engine core does not call ``Executor.sample_deferred``).
        self.sample_sent = False
        self._procs: list[subprocess.Popen] = []
        self._ctx: zmq.Context | None = None
        self._outs: list[zmq.Socket] = []
        self._in: zmq.Socket | None = None
        self._ipc_dir: str | None = None
        # The requests whose tokens accept_early() sent ahead of the scheduler's update,
        # until accept() does the rest (None: none sent).
        self._early: set[str] | None = None
        # accept() after a routed step: the worker sent the tokens (no membership to check).
        self._routed_accept = False
        # Requests whose backend cannot tell completion from tokens (stale ids are pruned
        # where it is read): a plan with one of them is not routed.
        self._opaque: set[str] = set()
        # Stops the process and closes the sockets: at shutdown, or when this client is
        # dropped without one, or at interpreter exit (ipc.release_with).
        self._release: Callable[[], Any] | None = None
        self._compiling: set[str] = set()
        # Request id -> its completion stop tokens (None: its backend must be asked).
        self._grammars: dict[str, frozenset[int] | None] = {}
        # Requests still thinking -> the token that ends it (see the module's invariants);
        # and whether any request can (else prompts are not sent with submissions).
        self._thinking: dict[str, int] = {}
        self._gated = bool(config.reasoning_parser) and not config.enable_in_reasoning
        self._refused: list[tuple[str, str]] = []
        self._compiled: tuple[list[str], list[tuple[str, str]]] = ([], [])
        # Answers of the processes (one per process asked), and the refusals of the
        # deferred fill's parts answered so far.
        self._replies: list[Any] = []
        self._filled: list[tuple[str, str]] = []
        self._parts_filled = 0
        # The view a deferred fill writes, until take_deferred_fill() hands it on, and how
        # many processes write it.
        self._fill_view: Any = None
        self._fill_parts = 0

    def _shard(self, request_id: str) -> int:
        """The process that holds a request's grammar. (``hash`` of a ``str`` is fixed
        within this process and cached on the string: the engine core alone asks.)"""
        return hash(request_id) % self.num_processes if self.num_processes > 1 else 0

    def _split(self, items: Iterable[Any], at: int | None = 0) -> list[list[Any]]:
        """``items`` by the process that holds each one's request: each item's element
        ``at`` is the request id (``None``: the item is). (No key function: at 256 rows a
        call per item cost ~50 us a split.)"""
        n = self.num_processes
        parts: list[list[Any]] = [[] for _ in range(n)]
        if n == 1:
            parts[0].extend(items)
        elif at is None:
            for item in items:
                parts[hash(item) % n].append(item)
        else:
            for item in items:
                parts[hash(item[at]) % n].append(item)
        return parts

    # ------------------------------------------------------------------ the process

    def _start(self) -> None:
        self._ipc_dir = ipc.make_ipc_dir("forkless-grammar-")
        from_proc = ipc.ipc_address(self._ipc_dir, "out")
        self._ctx = zmq.Context()
        self._in = self._ctx.socket(zmq.PULL)
        self._in.bind(from_proc)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        args = ipc.encode(self._args).hex()
        try:
            for index in range(self.num_processes):
                to_proc = ipc.ipc_address(self._ipc_dir, f"in-{index}")
                tokens_in = ipc.ipc_address(self._ipc_dir, f"tokens-{index}")
                out = self._ctx.socket(zmq.PUSH)
                out.bind(to_proc)
                self._outs.append(out)
                self._token_addresses.append(tokens_in)
                # A fresh interpreter running this module, not multiprocessing's spawn:
                # that would import the caller's main script again, which a script
                # without a __main__ guard cannot survive.
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", __name__, args, to_proc, from_proc, str(os.getpid()), self._ipc_dir,
                     f"{index}/{self.num_processes}", tokens_in], env=env))
        except BaseException:
            _stop_grammar_process(self._procs, self._outs, self._in, self._ctx, self._ipc_dir)
            self._procs, self._outs, self._token_addresses = [], [], []
            self._in = self._ctx = self._ipc_dir = None
            raise
        self._release = ipc.release_with(self, _stop_grammar_process, self._procs, self._outs, self._in, self._ctx,
                                         self._ipc_dir)
        logger.info("structured outputs: grammar process%s started (pid %s)", "es" if len(self._procs) > 1 else "",
                    ", ".join(str(p.pid) for p in self._procs))

    def _send(self, kind: bytes, payload: Any, index: int = 0) -> None:
        """Send a message to grammar process ``index``.

        Raises:
            RuntimeError: The process is dead (a PUSH socket with no peer would otherwise
                block the engine core's step loop forever).
        """
        if not self._procs:
            self._start()
        out, proc, frames = self._outs[index], self._procs[index], [kind, ipc.encode(payload)]
        while True:
            try:
                out.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                if proc.poll() is not None:
                    raise self._died(proc) from None
                out.poll(_IDLE_POLL_MS, zmq.POLLOUT)

    def _died(self, proc: subprocess.Popen) -> RuntimeError:
        """The error for a grammar process found dead, after stopping the others and
        removing the socket directory: the engine core fails with it and exits without
        a shutdown, and no process is left to remove the directory."""
        error = RuntimeError(f"the grammar process died (exit code {proc.returncode})")
        self.shutdown()
        return error

    def _receive(self, timeout_ms: int | None) -> bool:
        """Take one message from the process into its slot; ``False`` when none came
        within ``timeout_ms`` (``None``: wait, but not on a dead process)."""
        assert self._in is not None
        step = 1000 if timeout_ms is None else timeout_ms
        while not self._in.poll(step):
            for proc in self._procs:
                if proc.poll() is not None:
                    raise self._died(proc)
            if timeout_ms is not None:
                return False
        kind, payload = self._in.recv_multipart()
        body = ipc.decode(payload)
        if kind == _COMPILED:
            rid, stop, reason, end = body
            if rid in self._compiling:  # (not finished meanwhile)
                self._compiling.discard(rid)
                if reason is None:
                    self._grammars[rid] = frozenset(stop) if stop is not None else None
                    if end is not None:
                        self._thinking[rid] = end
                    if stop is None:
                        self._opaque.add(rid)
                    self._compiled[0].append(rid)
                else:
                    self._compiled[1].append((rid, reason))
        elif kind == _FILLED:
            self._filled += body
            self._parts_filled += 1
        elif kind == _REPLY:
            self._replies.append(body)
        elif kind == _ERROR:
            raise RuntimeError(f"structured outputs: the grammar process failed:\n{body}")
        return True

    def _wait_replies(self, count: int) -> list[Any]:
        """The answers of the ``count`` processes just asked."""
        while len(self._replies) < count:
            self._receive(None)
        replies, self._replies = self._replies, []
        return replies

    # ------------------------------------------------------------------ compilation

    def submit(self, request_id: str, params: StructuredOutputsParams, prompt_token_ids: Sequence[int] = ()) -> None:
        """Start compiling a request's grammar; :meth:`poll` says when it is ready (see
        the manager's ``submit``)."""
        prompt = list(prompt_token_ids) if self._gated else []
        self._send(_SUBMIT, [request_id, params, prompt], self._shard(request_id))
        self._compiling.add(request_id)

    def has_compiling(self) -> bool:
        return bool(self._compiling)

    def wait(self, timeout: float) -> None:
        """Block until a compilation ends or ``timeout`` seconds pass."""
        if self._compiling and not self._compiled[0] and not self._compiled[1]:
            self._receive(max(1, int(timeout * 1000)))

    def poll(self) -> tuple[list[str], list[tuple[str, str]]]:
        """``(ready, failed)`` since the last call (see the manager's ``poll``)."""
        if self._compiling:
            while self._receive(0):
                pass
        compiled, self._compiled = self._compiled, ([], [])
        return compiled

    # ------------------------------------------------------------------ the step

    def has_grammars(self) -> bool:
        # (Or an accept is due: a step's tokens went ahead, whatever has finished since.)
        return bool(self._grammars or self._refused) or self._early is not None

    def _view(self, rows: int) -> tuple[str, Any]:
        nbytes = rows * self._words * 4
        shared = self._allocate_shared(nbytes)
        if shared is None:
            raise RuntimeError("the executor gave no shared bitmask buffer")
        self._view_bytes = max(self._view_bytes, nbytes)
        return shared

    def _note_refused(self, refused: list) -> None:
        for rid, reason in refused:
            if self._grammars.pop(rid, 0) != 0:
                self._refused.append((rid, reason))

    def fill_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """Put the step's bitmask in the plan, filled by the process now (see the
        manager's ``fill_bitmask``)."""
        if not self._grammars:
            return
        self._take_fill()
        grammars = self._grammars
        rows = [s for s in scheduler_output.scheduled_requests if s.sample and s.request_id in grammars]
        if not rows:
            return
        # Each process fills its requests' rows (a request verifying m drafts has m + 1);
        # a refusal it found since this client last heard gets rows that allow everything
        # (the request fails at the next accept, and what it samples is dropped).
        items = []
        total = 0
        for s in rows:
            m = s.num_spec_tokens
            items.append([s.request_id, total, m, list(s.token_ids[len(s.token_ids) - m:]) if m else []])
            total += 1 + m
        name, view = self._view(total)
        asked = 0
        for index, part in enumerate(self._split(items)):
            if part:
                self._send(_FILL_NOW, [name, len(view), total, part], index)
                asked += 1
        for refused in self._wait_replies(asked):
            self._note_refused(refused)
        scheduler_output.structured_output_request_ids = [s.request_id for s in rows]
        scheduler_output.grammar_bitmask = view

    def defer(self, scheduler_output: SchedulerOutput) -> None:
        """Mark a plan made while the step before still runs (see the manager's ``defer``),
        and, where tokens are routed, have its worker send the step's tokens to the
        processes (see the module's invariants)."""
        mark_deferred(scheduler_output, self._grammars)
        if not (self.route_tokens and scheduler_output.defer_sampling and self._procs):
            return
        opaque = self._opaque
        if opaque:
            opaque.intersection_update(self._grammars)
            if not opaque.isdisjoint(scheduler_output.structured_output_request_ids):
                return
        scheduler_output.grammar_tokens_to = (self._next_fill_id, self._token_addresses)
        self._next_fill_id += 1

    def start_deferred_fill(self, scheduler_output: SchedulerOutput, pending: Any = None) -> None:
        """Have the process fill a deferred plan's bitmask (after the advance
        :meth:`accept` sent it); :meth:`take_deferred_fill` waits for it. Where the
        executor routes it (``deferred_sample_route`` of ``pending``, the plan's launched
        step), the process then has the workers sample the step itself (:attr:`sample_sent`)."""
        self._take_fill()
        tokens_from, self._tokens_from = self._tokens_from, None
        self._start_fill(None, scheduler_output, pending, *(tokens_from or (None, None)))

    def _start_fill(self, rows: list | None, plan: SchedulerOutput, pending: Any,
                    tokens_from: int | None = None, void: list[str] | None = None) -> None:
        # One message to each process: the advance accept_early hands over (rows) or the
        # worker sends (the tokens of routed fill tokens_from, less void), then the fill of
        # its requests' rows (all of them: each sends its part of the sample).
        ids = plan.structured_output_request_ids
        name, view = self._view(len(ids))
        route = self._sample_route(pending) if pending is not None else None
        fill_id = plan.grammar_tokens_to[0] if plan.grammar_tokens_to is not None else None
        tail = [fill_id, tokens_from, void or []]
        n = self.num_processes
        # The rows of most fills are the previous fill's, in the same order: then each
        # process is told so (ids None) rather than sent its rows again.
        same = ids == self._fill_ids
        self._fill_ids = ids
        if n == 1:
            self._send(_FILL, [rows, name, len(view), len(ids), None, None if same else ids, route, 1, *tail])
        else:
            kept = self._split(rows) if rows is not None else [None] * n
            if not same:
                rows_of: list[list[int]] = [[] for _ in range(n)]
                ids_of: list[list[str]] = [[] for _ in range(n)]
                for i, rid in enumerate(ids):
                    index = hash(rid) % n
                    rows_of[index].append(i)
                    ids_of[index].append(rid)
            for index in range(n):
                part = [None, None] if same else [rows_of[index], ids_of[index]]
                self._send(_FILL, [kept[index], name, len(view), len(ids), *part, route, n, *tail], index)
        self._fill_view = view
        self._fill_parts = n
        self.sample_sent = route is not None

    def take_deferred_fill(self) -> Any:
        """The bitmask :meth:`start_deferred_fill` started, once the process wrote it.

        Raises:
            RuntimeError: No fill was started.
        """
        if self._fill_view is None:
            raise RuntimeError("take_deferred_fill() without start_deferred_fill()")
        return self._take_fill()

    def _take_fill(self) -> Any:
        """Wait for the deferred fill in progress, if any, and return its view."""
        view = self._fill_view
        if view is not None:
            while self._parts_filled < self._fill_parts:
                self._receive(None)
            refused, self._filled, self._parts_filled = self._filled, [], 0
            self._fill_view = None
            self._note_refused(refused)
        return view

    def accept_early(self, kept: list[tuple[str, list[int]]], plan: SchedulerOutput, pending: Any = None) -> bool:
        """Send a collected step's tokens and start ``plan``'s deferred fill now, before
        the scheduler applies the step (:meth:`~forkless.core.sched.scheduler.Scheduler.kept_tokens`
        says which tokens it keeps): the process advances and fills while the engine core
        updates. :meth:`accept` then only tells completion and drops the finished
        requests; :meth:`start_deferred_fill` of ``plan`` (and ``pending``, its launched
        step) is not called. Returns ``False``
        (nothing sent) when a grammar's backend cannot tell completion from the tokens.
        """
        grammars = self._grammars
        if None in grammars.values() and any(grammars.get(rid, 0) is None for rid, _ in kept):
            return False
        self._take_fill()
        # (Ids whose grammar is gone are sent too: the process has dropped them as well,
        # and skips them.)
        self._start_fill(kept, plan, pending)
        self._early = {rid for rid, _ in kept}
        return True

    def take_routed_tokens(self, step: SchedulerOutput, fill: tuple[SchedulerOutput, Any] | None,
                           void: list[str]) -> bool:
        """Before a step planned with ``grammar_tokens_to`` is collected: have the
        processes take its tokens from the worker (less ``void``, the ids whose token the
        scheduler drops), with ``fill``'s deferred fill (its plan and launched step) where
        one is due, else by themselves; :meth:`accept` then only tells completion and
        drops the finished requests. Returns whether ``fill``'s fill was started (else
        :meth:`start_deferred_fill` of it is still to call)."""
        assert step.grammar_tokens_to is not None
        fill_id = step.grammar_tokens_to[0]
        self._take_fill()
        self._early, self._routed_accept = set(), True
        if fill is None:
            for index in range(self.num_processes):
                self._send(_CONSUME, [fill_id, void], index)
            return False
        if len(fill[0].structured_output_request_ids) * self._words * 4 > self._view_bytes:
            # Its rows need a larger segment: the fill goes out once the step is collected
            # (its sampling has mapped the segment in use), with these tokens.
            self._tokens_from = (fill_id, void)
            return False
        self._start_fill(None, fill[0], fill[1], fill_id, void)
        return True

    def accept(self, outputs: list[EngineCoreOutput],
               defer_advance: bool = False) -> tuple[list[str], list[tuple[str, str]]]:
        """Advance the grammars of a step's outputs (see the manager's ``accept``)."""
        if self._early is not None:
            return self._accepted_early(outputs)
        self._take_fill()
        rejected, self._refused = self._refused, []
        grammars = self._grammars
        rows = [[o.request_id, o.new_token_ids, o.finish_reason is not None] for o in outputs
                if o.request_id in grammars]
        if not rows:
            return [], rejected
        if defer_advance and all(grammars[rid] is not None for rid, _, done in rows if not done):
            complete = []
            for rid, tokens, done in rows:
                if done:
                    del grammars[rid]
                    self._thinking.pop(rid, None)
                elif self._completes(rid, tokens, grammars[rid]):  # type: ignore[arg-type]
                    del grammars[rid]
                    complete.append(rid)
            for index, part in enumerate(self._split(rows)):
                if part:
                    self._send(_ACCEPT, [True, part], index)
            return complete, rejected
        # A backend that cannot tell completion from the tokens: the processes advance
        # now and answer (a deferred advance would not be answered).
        asked = 0
        for index, part in enumerate(self._split(rows)):
            if part:
                self._send(_ACCEPT, [False, part], index)
                asked += 1
        complete = []
        for done_now, refused in self._wait_replies(asked):
            complete += done_now
            for rid, reason in refused:
                grammars.pop(rid, None)
                rejected.append((rid, reason))
        for rid, tokens, done in rows:
            if done:
                grammars.pop(rid, None)
                self._thinking.pop(rid, None)
            else:
                grammar_tokens(self._thinking, rid, tokens)  # (the process saw its reasoning end too)
        for rid in complete:
            grammars.pop(rid, None)
        return complete, rejected

    def _completes(self, rid: str, tokens: list[int], stops: frozenset[int]) -> bool:
        """Whether a step's ``tokens`` complete a request's grammar, told from the stop
        tokens: its last token is one, and it is the grammar's (after the reasoning's end,
        for a request that thinks; it then thinks no more)."""
        tokens = grammar_tokens(self._thinking, rid, tokens)
        return bool(tokens) and tokens[-1] in stops

    def _accepted_early(self, outputs: list[EngineCoreOutput]) -> tuple[list[str], list[tuple[str, str]]]:
        """:meth:`accept` after :meth:`accept_early` sent the tokens: the complete and the
        finished requests leave (the finished ones in the process too, which advanced
        them: it did not know); the fill runs on."""
        early, self._early = self._early, None
        assert early is not None
        routed, self._routed_accept = self._routed_accept, False
        rejected, self._refused = self._refused, []
        grammars = self._grammars
        complete: list[str] = []
        finished: list[str] = []
        for out in outputs:
            rid = out.request_id
            stops = grammars.get(rid, 0)
            if stops == 0:
                continue
            if not routed and rid not in early:
                raise RuntimeError(f"request {rid!r}: its tokens reached the grammars after the bitmask's fill "
                                   "started (the scheduler kept a token kept_tokens() left out)")
            if out.finish_reason is not None:
                del grammars[rid]
                self._thinking.pop(rid, None)
                finished.append(rid)
            elif self._completes(rid, out.new_token_ids, stops):  # type: ignore[arg-type]
                del grammars[rid]  # the process dropped it too (completion from tokens)
                complete.append(rid)
        if finished:
            self._finish(finished)
        return complete, rejected

    def _finish(self, request_ids: list[str]) -> None:
        for index, part in enumerate(self._split(request_ids, None)):
            if part:
                self._send(_FINISH, part, index)

    def finish(self, request_ids: Any) -> None:
        """Forget requests (finished, aborted, failed); unknown ids are ignored."""
        gone = []
        for rid in request_ids:
            self._thinking.pop(rid, None)
            if self._grammars.pop(rid, 0) != 0 or rid in self._compiling:
                self._compiling.discard(rid)
                gone.append(rid)
        if gone:
            self._finish(gone)

    def shutdown(self) -> None:
        """Stop the process (it releases the backends) and close the sockets."""
        release, self._release = self._release, None
        if release is not None:
            release()
        self._procs, self._outs, self._token_addresses = [], [], []
        self._in = self._ctx = self._ipc_dir = None
        self._fill_view = None


def _stop_grammar_process(procs: list[subprocess.Popen], outs: list[zmq.Socket], inbox: zmq.Socket,
                          ctx: zmq.Context, ipc_dir: str) -> None:
    """Tell the grammar processes to stop (killed if one has not within 5 s) and close the
    client's sockets, context and socket directory. Refers to no client: it runs when
    one is dropped too."""
    for proc, out in zip(procs, outs):
        if proc.poll() is None:
            try:
                out.send_multipart([_SHUTDOWN, ipc.encode(None)])
            except zmq.ZMQError:
                pass
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for sock in [*outs, inbox]:
        sock.close(linger=0)
    ctx.term()
    ipc.remove_ipc_dir(ipc_dir)


class _SegmentMap:
    """The process's map of the executor's segment named in the newest fill."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.segment: Any = None

    def use(self, name: str) -> bool:
        """Map segment ``name`` if it is not the one mapped; whether it changed."""
        if name == self.name:
            return False
        from forkless.protocol.shared_memory import Segment

        if self.segment is not None:
            self.segment.release()
        self.segment, self.name = Segment(name=name), name
        # Mapping it registered it with this process's resource tracker (not multiprocessing's
        # child: a tracker of its own), which would unlink it when this process exits: the
        # executor owns it.
        from multiprocessing import resource_tracker

        resource_tracker.unregister(self.segment._name, "shared_memory")
        return True

    def view(self, nbytes: int) -> memoryview:
        assert self.segment is not None
        return self.segment.buf[:nbytes]


def _outputs(rows: Iterable[tuple[str, list[int], bool]]) -> list[SimpleNamespace]:
    """Accept rows as the manager reads outputs."""
    return [SimpleNamespace(request_id=rid, new_token_ids=tokens, finish_reason="done" if done else None)
            for rid, tokens, done in rows]


class _Shutdown(Exception):
    """The engine core said stop, or is gone, while the process waited for tokens."""


def _grammar_process_main(args_bytes: bytes, addr_in: str, addr_out: str, parent_pid: int, ipc_dir: str,
                          index: int = 0, count: int = 1, addr_tokens: str | None = None) -> None:
    """Entry point of grammar process ``index`` of ``count`` (see the module's invariants);
    ``addr_tokens``: where it binds the socket the workers send routed steps' tokens to."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine core shuts it down
    ipc.leave_sigterm_to_parent(parent_pid)  # (also of a SIGTERM to the process group)
    from forkless.plugins import load_general_plugins
    from forkless.structured_output.manager import StructuredOutputManager

    load_general_plugins()  # backends a plugin registers resolve here too
    config_dict, tokenizer_path, vocab_size, eos = ipc.decode(args_bytes)
    segments = _SegmentMap()
    # PUSH sockets to the workers' sample inboxes, by address (a fill's route).
    to_workers: dict[str, Any] = {}
    manager = StructuredOutputManager(StructuredOutputsConfig(**config_dict), tokenizer_path, vocab_size, eos,
                                      allocate_buffer=segments.view)
    ctx, inbox, outbox = ipc.connect_to_parent(addr_in, addr_out)
    tokens_inbox = None
    # While a routed fill waits for its tokens: the token socket, and the engine core's
    # (a shutdown must still end the wait).
    tokens_poller = zmq.Poller()
    if addr_tokens is not None:
        tokens_inbox = ctx.socket(zmq.PULL)
        tokens_inbox.bind(addr_tokens)
        tokens_poller.register(tokens_inbox, zmq.POLLIN)
        tokens_poller.register(inbox, zmq.POLLIN)
    # The engine core's messages read while waiting for a routed step's tokens, handled
    # after them in order; tokens that came for a later fill than the one waited for.
    backlog: deque[list[bytes]] = deque()
    early_tokens: dict[int, list[int] | None] = {}
    # Routed fills whose tokens are still to take: fill id -> (rows, request ids) of
    # this process's requests (rows None: all of them, in order).
    routed: dict[int, tuple[list[int] | None, list[str]]] = {}
    # This process's part of the last deferred fill's rows: (rows, request ids), rows None
    # for all of them (a fill with ids None has the same).
    part: tuple[list[int] | None, list[str]] = (None, [])
    # Refusals an advance found that no fill's reply carried yet.
    refused: list = []
    # Each deferred fill's time here (its advance included), logged at the end.
    fill_seconds: list[float] = []
    # FORKLESS_STEP_TRACE_DIR: one record per deferred fill (forkless.metrics.step_trace).
    trace = StepTrace.open("grammar" if count == 1 else f"grammar{index}")

    def send(kind: bytes, payload: Any) -> None:
        outbox.send_multipart([kind, ipc.encode(payload)])

    def tell_workers(route: list, where: str | None, nbytes: int, parts: int) -> None:
        # The workers sample the step now (before the engine core hears of the fill), once
        # every process's part came.
        seq, addresses = route
        ipc.push_to_peers(ctx, to_workers, addresses, sample_message(seq, where, nbytes, parts))

    def map_segment(name: str) -> None:
        if segments.use(name):
            manager.drop_buffer()  # its buffer viewed the old segment

    def take_tokens(fill_id: int, void: list[str]) -> None:
        # Advance this process's grammars over routed fill fill_id's tokens, which the
        # worker sends (waited for), less the void ids.
        if tokens_inbox is None:
            raise RuntimeError("a routed fill's tokens, but the process has no token socket")
        rows, ids = routed.pop(fill_id)
        tokens = early_tokens.pop(fill_id, 0)
        while tokens == 0:
            ready = dict(tokens_poller.poll(1000))
            if tokens_inbox in ready:
                got, values = decode_grammar_tokens(tokens_inbox.recv_multipart()[1])
                if got == fill_id:
                    tokens = values
                elif got > fill_id:
                    early_tokens[got] = values
                # (an older fill's: taken already, cannot come twice)
            elif inbox in ready:
                frames = inbox.recv_multipart()
                if frames[0] == _SHUTDOWN:
                    raise _Shutdown
                backlog.append(frames)
            elif not ready and not ipc.parent_alive(parent_pid):
                raise _Shutdown
        if tokens is None:
            return  # the step failed: nothing was sampled
        skip = set(void)
        positions = range(len(ids)) if rows is None else rows
        manager.advance_kept([(rid, [t]) for i, rid in zip(positions, ids)
                              if (t := tokens[i]) >= 0 and rid not in skip])

    try:
        while True:
            if not backlog and not inbox.poll(_COMPILING_POLL_MS if manager.has_compiling() else _IDLE_POLL_MS):
                if not ipc.parent_alive(parent_pid):
                    break
            else:
                kind, payload = backlog.popleft() if backlog else inbox.recv_multipart()
                if kind == _SHUTDOWN:
                    break
                try:
                    if kind == _SUBMIT:
                        rid, params, prompt = ipc.decode(payload)
                        manager.submit(rid, msgspec.convert(params, StructuredOutputsParams), prompt)
                    elif kind == _FINISH:
                        manager.finish(ipc.decode(payload))
                    elif kind == _ACCEPT:
                        deferred, rows = ipc.decode(payload)
                        complete, rejected = manager.accept(_outputs(rows), deferred)
                        if deferred:
                            refused += rejected  # (complete: the client told it already)
                        else:
                            send(_REPLY, [complete, rejected])
                    elif kind == _FILL:
                        (rows, name, nbytes, num_rows, indices, ids, route, parts, fill_id, tokens_from,
                         void) = ipc.decode(payload)
                        if ids is None:
                            indices, ids = part
                        else:
                            part = (indices, ids)
                        try:
                            if tokens_from is not None:  # the worker's (the client checked the backends)
                                take_tokens(tokens_from, void)
                            # (Timed from the tokens: a routed fill comes before they do.)
                            started = time.perf_counter()
                            received = StepTrace.now() if trace is not None else 0.0
                            if rows is not None:  # accept_early's advance (the client checked the backends)
                                manager.advance_kept(rows)
                            if fill_id is not None:
                                routed[fill_id] = (indices, ids)
                            map_segment(name)
                            # (indices None: every row is this process's.)
                            manager.fill_deferred_rows_now(num_rows, enumerate(ids) if indices is None
                                                           else zip(indices, ids))
                        except BaseException:
                            # The workers must not wait for a sample that never comes; the
                            # engine core raises the error (its step is not used).
                            if route is not None:
                                tell_workers(route, None, 0, parts)
                            raise
                        filled = StepTrace.now() if trace is not None else 0.0
                        if route is not None:
                            tell_workers(route, name, nbytes, parts)
                        if trace is not None:
                            trace.add(received=received, filled=filled, told=StepTrace.now(), rows=len(ids),
                                      seq=route[0] if route is not None else None)
                        refused += manager.take_refused()
                        send(_FILLED, refused)
                        refused = []
                        fill_seconds.append(time.perf_counter() - started)
                    elif kind == _CONSUME:
                        fill_id, void = ipc.decode(payload)
                        take_tokens(fill_id, void)
                    elif kind == _FILL_NOW:
                        name, nbytes, num_rows, rows = ipc.decode(payload)
                        map_segment(name)
                        manager.fill_rows(num_rows, [
                            (SimpleNamespace(request_id=rid, num_spec_tokens=m, token_ids=drafts), offset)
                            for rid, offset, m, drafts in rows])
                        refused += manager.take_refused()
                        send(_REPLY, refused)
                        refused = []
                    else:
                        raise ValueError(f"unknown message {kind!r}")
                except _Shutdown:
                    break
                except Exception:  # noqa: BLE001 -- reported to the engine core, which raises it
                    send(_ERROR, traceback.format_exc())
            if manager.has_compiling():
                ready, failed = manager.poll()
                for rid in ready:
                    send(_COMPILED, [rid, manager.completion_stop_ids(rid), None, manager.reasoning_end_id(rid)])
                for rid, reason in failed:
                    send(_COMPILED, [rid, None, reason, None])
    finally:
        if fill_seconds:
            fill_seconds.sort()
            logger.info("grammar process: %d deferred fills, median %.2f ms, 90th percentile %.2f ms",
                        len(fill_seconds), fill_seconds[len(fill_seconds) // 2] * 1e3,
                        fill_seconds[len(fill_seconds) * 9 // 10] * 1e3)
        if trace is not None:
            trace.close()
        manager.shutdown()
        segments.segment = None
        inbox.close(linger=0)
        if tokens_inbox is not None:
            tokens_inbox.close(linger=0)
        for sock in to_workers.values():
            sock.close()
        outbox.close()
        ctx.term()
        ipc.remove_ipc_dir_if_orphaned(parent_pid, ipc_dir)


if __name__ == "__main__":
    _index, _count = (int(n) for n in sys.argv[6].split("/"))
    _grammar_process_main(bytes.fromhex(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], _index,
                          _count, sys.argv[7] if len(sys.argv) > 7 else None)
    ipc.exit_process(0)
