"""The engine core's side of structured outputs: compile off the step loop, one packed
bitmask per step, grammars advanced with the sampled tokens.

Invariants:
    * Compilation (and building a backend: loading the tokenizer, xgrammar's vocabulary
      tables) runs on a small thread pool, never on the step loop. A constrained request
      waits here, outside the scheduler, until its grammar is ready; the requests already
      running keep stepping meanwhile.
    * A constrained request's grammar has accepted exactly its output tokens whenever its
      bitmask is filled. Synchronous steps fill it at the plan. Under async scheduling
      with an executor that samples deferred steps, a plan made while the step before
      still runs is marked :meth:`defer`: once that step's tokens are accepted, the
      engine core has it filled on the manager's fill thread (:meth:`start_deferred_fill`)
      while the device runs the new step's forward and the step loop goes on (plans the
      next step), and takes it (:meth:`take_deferred_fill`) just before the next launch;
      otherwise constrained requests keep steps synchronous (their sampling reads their
      own history, like penalties). Speculative drafts advance a grammar only while its
      bitmask rows are filled (steps with drafts are synchronous), and are rolled back
      before the step runs.
    * The fill thread runs only between :meth:`start_deferred_fill` and
      :meth:`take_deferred_fill`, and then touches only the grammars of that plan's rows
      (and those of the advance it was handed) and the bitmask buffer; everything else
      that reads or writes a grammar or the buffer (accept, synchronous fills) runs on
      the step loop outside that window (it waits for the fill first). Dropping a request
      meanwhile only forgets it here: the thread fills its row, and whatever that row
      samples is dropped.
    * The advance may trail the step loop by one call, and only into the fill thread:
      ``accept(..., defer_advance=True)`` (the engine core's collect right before
      :meth:`start_deferred_fill`) tells completion from the tokens alone for backends
      that declare ``completion_from_tokens``, and leaves their grammars' advance to the
      fill thread, ahead of the fill. Any other call that reads a grammar runs a
      still-pending advance first. A token such an advance refuses (a backend fault: the
      token was sampled under that grammar's own mask) fails its request at the next
      :meth:`accept`, one step later than a synchronous advance would.
    * With a reasoning parser (``StructuredOutputsConfig.reasoning_parser``, unless
      ``enable_in_reasoning``), a request whose prompt does not end the reasoning is
      *thinking* (in :attr:`_thinking`, with the parser's ``end_token_id``) from its
      compilation until that token comes: it keeps its grammar and its bitmask rows, as
      any constrained request (so the plans, deferred ones included, are the same), but
      its rows allow everything and its grammar takes none of its tokens. The tokens
      after the end token, in the step that samples it, are the grammar's first; where
      that step verifies drafts past a drafted end token, the rows after it are the
      grammar's, filled as any request's drafts are. A parser without an
      ``end_token_id`` thinks in no request (the grammar holds from the first token), nor
      does a request whose params say the reasoning has ended
      (``StructuredOutputsParams._reasoning_ended``: a chat request that leaves the
      reasoning out, ``include_reasoning=false``, as vLLM's ``reasoning_ended``).
      Whether a request thinks changes only in :meth:`accept` and :meth:`advance_kept`,
      on the step loop, before the fill that reads it starts.
    * The step's bitmask has ``1 + num_spec_tokens`` rows per scheduled request that
      samples and has a grammar (one per position it samples or verifies), in
      ``SchedulerOutput.structured_output_request_ids`` order; it crosses to the worker
      as the bytes of a C-ordered int32 array (no pickle).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, NamedTuple, Sequence, TypeVar

from forkless.logger import init_logger
from forkless.structured_output.config import StructuredOutputsConfig
from forkless.structured_output.registry import AUTO_ORDER, StructuredOutputBackendRegistry
from forkless.structured_output.validation import grammar_spec

if TYPE_CHECKING:
    import numpy as np

    from forkless.protocol.step import EngineCoreOutput, SchedulerOutput
    from forkless.sampling_params import StructuredOutputsParams
    from forkless.structured_output.interface import StructuredOutputBackend, StructuredOutputGrammar

logger = init_logger(__name__)

_T = TypeVar("_T")


class _Advance(NamedTuple):
    """One backend's grammars to advance over their tokens (see ``accept``)."""

    backend: StructuredOutputBackend
    grammars: list[StructuredOutputGrammar]
    request_ids: list[str]
    tokens: list[list[int]]


def _refusal(tokens: list[int]) -> str:
    return f"structured outputs: the grammar refused token(s) {tokens} it had allowed"


def grammar_tokens(thinking: dict[str, int], request_id: str, tokens: list[int]) -> list[int]:
    """The part of a request's new ``tokens`` that its grammar takes: all of them, or,
    while it thinks (in ``thinking``, with the token that ends it), those after the end
    token, and it is then removed from ``thinking``; none before. The manager and the
    grammar process's client follow a request's reasoning with it alike."""
    end = thinking.get(request_id)
    if end is None:
        return tokens
    try:
        at = tokens.index(end)
    except ValueError:
        return []
    del thinking[request_id]
    return tokens[at + 1:]


def mark_deferred(scheduler_output: SchedulerOutput, grammars: Collection[str]) -> None:
    """Mark a plan whose sampling rows hold a grammar (an id in ``grammars``) as one
    whose bitmask comes later (``defer_sampling``, the rows in
    ``structured_output_request_ids``); a plan without such rows is left as it is."""
    if not grammars:
        return
    ids = []
    for s in scheduler_output.scheduled_requests:  # (one pass: at batch 256 it runs every step)
        if s.sample and s.request_id in grammars:
            if s.num_spec_tokens:
                # Drafts keep steps synchronous (the scheduler's invariant): never deferred.
                raise RuntimeError("a constrained request with drafts was planned while a step was in flight")
            ids.append(s.request_id)
    if not ids:
        return
    scheduler_output.structured_output_request_ids = ids
    scheduler_output.defer_sampling = True


class StructuredOutputManager:
    """Grammars of the engine core's constrained requests.

    Args:
        config: The server's structured-output settings.
        tokenizer_path: Folder of the model's tokenizer (loaded on first use, on a
            compile thread).
        vocab_size: Width of the model's logits.
        eos_token_ids: The model's EOS ids (what a complete grammar allows).
        allocate_buffer: Makes the host buffer a step's bitmask is filled into, given its
            size in bytes (``Executor.allocate_bitmask_buffer``: pinned memory for an
            in-process CUDA worker, which then copies it to the device without staging
            it); ``None``, or a call that returns ``None``: a ``bytearray``.
    """

    def __init__(self, config: StructuredOutputsConfig, tokenizer_path: str, vocab_size: int,
                 eos_token_ids: list[int], allocate_buffer: Callable[[int], Any] | None = None) -> None:
        self.config = config
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._backends: dict[str, StructuredOutputBackend] = {}
        self._compiling: dict[str, concurrent.futures.Future] = {}
        # Each constrained request's grammar, and the backend that compiled it.
        self._grammars: dict[str, StructuredOutputGrammar] = {}
        self._backend_of: dict[str, StructuredOutputBackend] = {}
        # Requests still thinking (see the module's invariants) -> the token that ends it;
        # and the reasoning parser that tells (built once, with the tokenizer; None until
        # then, or without one).
        self._thinking: dict[str, int] = {}
        self._reasoner: Any = None
        # The step's packed bitmask (see _rows).
        self._allocate_buffer = allocate_buffer
        self._buffer: Any = bytearray()
        # The deferred fill in progress on the fill thread (start_deferred_fill), and the
        # interpreter's switch interval to restore when it is taken.
        self._filler: concurrent.futures.ThreadPoolExecutor | None = None
        self._fill_job: concurrent.futures.Future | None = None
        self._switch_interval = 0.0
        # Grammars whose advance accept() left for the fill thread (_Advance), and the
        # refusals such advances found, for the next accept() to report.
        self._advance: list[_Advance] = []
        self._refused: list[tuple[str, str]] = []
        #: Whether a deferred fill has the workers sample its step itself: never here (the
        #: grammar process's client can; the engine core then skips ``sample_deferred``).
        self.sample_sent = False

    # ------------------------------------------------------------------ compilation

    def _backend(self, name: str) -> StructuredOutputBackend:
        """The backend called ``name`` (built once, on a compile thread)."""
        with self._lock:
            backend = self._backends.get(name)
            if backend is None:
                if self._tokenizer is None:
                    from forkless.tokenizers.loading import load_tokenizer

                    self._tokenizer = load_tokenizer(self.tokenizer_path)
                started = time.perf_counter()
                cls = StructuredOutputBackendRegistry.resolve(name)
                backend = cls(self._tokenizer, self.vocab_size, self.eos_token_ids, self.config)
                logger.info("structured outputs: backend %s ready in %.1f s", name, time.perf_counter() - started)
                self._backends[name] = backend
            return backend

    def _compile(self, params: StructuredOutputsParams, prompt_token_ids: Sequence[int]
                 ) -> tuple[StructuredOutputGrammar, StructuredOutputBackend, int | None]:
        kind, spec, any_whitespace = grammar_spec(params, self.config)
        first = params._backend or self.config.backend
        names = [first]
        if (self.config.backend == "auto" and first in AUTO_ORDER
                and not (params.disable_fallback or self.config.disable_fallback)):
            # auto chose the first backend whose torch-free check (run in the API server)
            # accepted the constraint; xgrammar's check reads it with llguidance, which
            # accepts some grammars xgrammar's own parser refuses (an empty alternative):
            # the next backend then gets it, as auto's own choice would have been.
            names += AUTO_ORDER[AUTO_ORDER.index(first) + 1:]
        first_error: ValueError | None = None
        for name in names:
            backend = self._backend(name)
            try:
                grammar = backend.compile_grammar(kind, spec, any_whitespace=any_whitespace)
            except ValueError as exc:
                first_error = first_error or exc
                if name != names[-1]:
                    logger.info("structured outputs: %s; falling back to %s", exc, names[names.index(name) + 1])
                continue
            return grammar, backend, None if params._reasoning_ended else self._reasoning_end(prompt_token_ids)
        assert first_error is not None
        raise first_error

    def _reasoning_end(self, prompt_token_ids: Sequence[int]) -> int | None:
        """The token that will end the reasoning of a request with this prompt, or
        ``None`` when its grammar holds from the first token (no reasoning parser, or
        ``enable_in_reasoning``, or a parser without an ``end_token_id``, or a prompt that
        ends the reasoning already: a template that closed the think block). On a
        compile thread, after :meth:`_backend` (which loads the tokenizer)."""
        config = self.config
        if not config.reasoning_parser or config.enable_in_reasoning:
            return None
        with self._lock:
            if self._reasoner is None:
                from forkless.reasoning import ReasoningParserManager

                parser = ReasoningParserManager.resolve(config.reasoning_parser, config.reasoning_parser_plugin)
                self._reasoner = parser(self._tokenizer)
                if self._reasoner.end_token_id is None:
                    logger.warning("structured outputs: the %s reasoning parser names no end_token_id (its end tag "
                                   "is not one token of this vocabulary): constraints hold from the first token, "
                                   "reasoning included", config.reasoning_parser)
            reasoner = self._reasoner
        end = reasoner.end_token_id
        if end is None:
            return None
        try:
            ended = reasoner.is_reasoning_end(list(prompt_token_ids))
        except NotImplementedError:
            ended = False  # (as the server's ChoiceParser: the output starts in the reasoning)
        return None if ended else int(end)

    def submit(self, request_id: str, params: StructuredOutputsParams, prompt_token_ids: Sequence[int] = ()) -> None:
        """Start compiling a request's grammar; :meth:`poll` says when it is ready.

        Args:
            request_id: The request.
            params: Its constraint.
            prompt_token_ids: Its prompt, which says whether its output starts in the
                reasoning (read only with a reasoning parser).
        """
        if self._pool is None:
            # Two threads: one compilation may wait on another's backend being built;
            # more would only take cores from the step loop.
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(2, os.cpu_count() or 1), thread_name_prefix="forkless-grammar")
        self._compiling[request_id] = self._pool.submit(self._compile, params, prompt_token_ids)

    def has_compiling(self) -> bool:
        """Whether a request is still waiting for its grammar."""
        return bool(self._compiling)

    def wait(self, timeout: float) -> None:
        """Block until a compilation ends or ``timeout`` seconds pass (when nothing else
        can run: spinning would only take the compile threads' core)."""
        if self._compiling:
            concurrent.futures.wait(list(self._compiling.values()), timeout=timeout,
                                    return_when=concurrent.futures.FIRST_COMPLETED)

    def poll(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Requests whose compilation ended since the last call.

        Returns:
            ``(ready, failed)``: ids now holding a grammar, in submission order, and
            ``(id, reason)`` of those whose constraint did not compile.
        """
        ready: list[str] = []
        failed: list[tuple[str, str]] = []
        for rid, future in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[rid]
            try:
                self._grammars[rid], self._backend_of[rid], end = future.result()
                if end is not None:
                    self._thinking[rid] = end
                ready.append(rid)
            except Exception as exc:  # a bad constraint fails its own request only
                reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                failed.append((rid, f"structured outputs: {reason}"))
        return ready, failed

    def completion_stop_ids(self, request_id: str) -> list[int] | None:
        """The stop tokens that complete a ready request's grammar where its backend tells
        completion from them (``completion_from_tokens``); ``None`` otherwise."""
        backend = self._backend_of.get(request_id)
        return backend.stop_token_ids() if backend is not None and backend.completion_from_tokens else None

    def reasoning_end_id(self, request_id: str) -> int | None:
        """The token that ends a ready request's reasoning while it still thinks (its
        grammar then starts after it); ``None`` once it does not."""
        return self._thinking.get(request_id)

    def drop_buffer(self) -> None:
        """Forget the reused bitmask buffer: the next fill allocates one again (the
        grammar process, when the executor's segment was replaced)."""
        self._join_fill()
        self._buffer = bytearray()

    def take_refused(self) -> list[tuple[str, str]]:
        """The refusals a deferred advance found that no :meth:`accept` reported yet (they
        will not be reported by one now)."""
        refused, self._refused = self._refused, []
        return refused

    # ------------------------------------------------------------------ the step

    def has_grammars(self) -> bool:
        """Whether any request holds a grammar (or a refusal is still to be reported)."""
        return bool(self._grammars or self._refused)

    def fill_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """Put the step's bitmask in the plan (a no-op when no constrained request samples).

        A request verifying ``m`` drafts gets ``m + 1`` rows: its grammar is advanced
        through the drafts it accepts, a row filled after each, then rolled back (the
        tokens the target keeps are accepted for good in :meth:`accept`). A draft the
        grammar refuses, or one that would complete it, ends the advance: the rows after
        it repeat the row at it, which refuses that draft, so the target rejects it there
        (and a completed grammar's stop token is only ever emitted last).
        """
        grammars = self._grammars
        if not grammars:
            return
        self._join_fill()
        self._advance_now()
        rows = [s for s in scheduler_output.scheduled_requests if s.sample and s.request_id in grammars]
        if not rows:
            return
        offsets = []
        total = 0
        for s in rows:
            offsets.append(total)
            total += 1 + s.num_spec_tokens
        self.fill_rows(total, list(zip(rows, offsets)))
        scheduler_output.structured_output_request_ids = [s.request_id for s in rows]
        scheduler_output.grammar_bitmask = self._buffer

    def fill_rows(self, num_rows: int, rows: list[tuple[Any, int]]) -> None:
        """Fill some rows of a ``num_rows``-row bitmask now, as :meth:`fill_bitmask` does:
        each ``(scheduled request, offset)`` its ``1 + num_spec_tokens`` rows from
        ``offset``; a request without a grammar here gets rows that allow everything.
        Other rows are left as they are (a grammar process of several fills its own)."""
        self._join_fill()
        self._advance_now()
        bitmask = self._rows(num_rows)
        grammars = self._grammars
        thinking = self._thinking
        # (request id, grammar, first row, drafts verified under the grammar)
        live: list[tuple[str, StructuredOutputGrammar, int, list[int]]] = []
        for s, offset in rows:
            rid, m = s.request_id, s.num_spec_tokens
            grammar = grammars.get(rid)
            drafts = list(s.token_ids[len(s.token_ids) - m:]) if m else []
            if grammar is not None and rid in thinking:
                # Unconstrained up to a drafted end token and at it; the grammar's rows
                # start right after it (none when no draft ends the reasoning).
                end = thinking[rid]
                cut = drafts.index(end) + 1 if end in drafts else m + 1
                bitmask[offset:offset + min(cut, m + 1)] = -1
                if cut > m:
                    continue
                offset, drafts = offset + cut, drafts[cut:]
            if grammar is None:
                bitmask[offset:offset + 1 + m] = -1
            else:
                live.append((rid, grammar, offset, drafts))
        if not live:
            return
        self._fill(bitmask, [(rid, g, offset) for rid, g, offset, _ in live])
        if any(drafts for *_, drafts in live):
            self._fill_drafts(bitmask, live)

    def defer(self, scheduler_output: SchedulerOutput) -> None:
        """Mark a plan made while the step before still runs: its constrained rows'
        bitmask comes from :meth:`start_deferred_fill`, once the grammars hold that step's
        tokens (``SchedulerOutput.defer_sampling``)."""
        mark_deferred(scheduler_output, self._grammars)

    def start_deferred_fill(self, scheduler_output: SchedulerOutput, pending: Any = None) -> None:
        """Start filling the bitmask of a plan marked by :meth:`defer` on the fill thread,
        one row per constrained row, into the reused buffer of :meth:`_rows`, from the
        grammars as they are once the advance :meth:`accept` left pending (if any) has run
        there first; :meth:`take_deferred_fill` returns it. A request whose grammar is gone
        (it completed, failed or was aborted since the plan) gets a row that allows
        everything: it has finished, and whatever its row samples is dropped.

        The backends' fills release the GIL, so the step loop runs on meanwhile; for the
        thread to get the GIL back promptly between its calls, the interpreter's switch
        interval is lowered to 0.2 ms until the fill is taken (at 5 ms, the default, a
        0.4 ms fill took 5.6 ms beside a busy step loop).

        ``pending`` (the plan's launched step) is for the grammar process, which can have
        the workers sample it; here the engine core samples it (:attr:`sample_sent` is
        always false).
        """
        self._join_fill()
        ids = scheduler_output.structured_output_request_ids
        bitmask = self._rows(len(ids))
        groups = self._by_backend(self._live_rows(bitmask, enumerate(ids)))
        advance, self._advance = self._advance, []
        if not groups and not advance:  # nothing to do: every row's grammar is gone
            self._fill_job = concurrent.futures.Future()
            self._fill_job.set_result([])
            return
        if self._filler is None:
            self._filler = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                                 thread_name_prefix="forkless-grammar-fill")
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, 2e-4))
        self._fill_job = self._filler.submit(self._advance_and_fill, advance, bitmask, groups)

    def fill_deferred_rows_now(self, num_rows: int, rows: Iterable[tuple[int, str]]) -> None:
        """:meth:`start_deferred_fill` and :meth:`take_deferred_fill` in one, on the calling
        thread, for some rows of a ``num_rows``-row bitmask, given as ``(row, request id)``
        (the other rows are left as they are: a grammar process of several fills its own).
        For the grammar process, which has nothing else to do meanwhile."""
        self._join_fill()
        self._advance_now()
        bitmask = self._rows(num_rows)
        self._fill_groups(bitmask, self._by_backend(self._live_rows(bitmask, rows)))

    def _live_rows(self, bitmask: np.ndarray, rows: Iterable[tuple[int, str]]
                   ) -> list[tuple[str, StructuredOutputGrammar, int]]:
        """``(request id, grammar, row)`` of the rows whose request holds a grammar; the
        others' rows are set to allow everything (the request finished meanwhile)."""
        live = []
        grammars = self._grammars
        thinking = self._thinking
        for i, rid in rows:
            grammar = grammars.get(rid)
            if grammar is None or rid in thinking:  # (thinking: unconstrained for now)
                bitmask[i] = -1
            else:
                live.append((rid, grammar, i))
        return live

    def advance_kept(self, kept: list[tuple[str, list[int]]]) -> None:
        """Advance grammars now over the tokens the scheduler keeps for unfinished requests
        (``(request id, tokens)``, as :meth:`accept_early` gets them); each grammar's
        backend must tell completion from the tokens (``completion_from_tokens``), and a
        complete grammar is dropped (its request finishes). What :meth:`accept` with
        ``defer_advance`` and the fill's advance do, without building an output per row:
        the grammar process's path. Refusals go to :meth:`take_refused`."""
        self._join_fill()
        self._advance_now()
        grammars = self._grammars
        if self._thinking:
            kept = [(rid, grammar_tokens(self._thinking, rid, tokens)) for rid, tokens in kept if rid in grammars]
            kept = [row for row in kept if row[1]]  # (no token for the grammar: nothing to do)
        items = [(rid, grammar, row) for row in kept if (grammar := grammars.get(rid := row[0])) is not None]
        for backend, grammars_of, rows in self._by_backend(items):
            if not backend.completion_from_tokens:
                raise RuntimeError(f"advance_kept() needs a backend that tells completion from the tokens; "
                                   f"{backend.name} does not")
            todo = self._drop_complete(_Advance(backend, grammars_of, [rid for rid, _ in rows], [t for _, t in rows]))
            if todo.grammars:
                self._note_refused(self._run_advance([todo]))

    def _drop_complete(self, advance: _Advance, complete: list[str] | None = None) -> _Advance:
        """Drop the grammars that ``advance``'s tokens complete (its backend tells
        completion from the tokens), adding their ids to ``complete``; the rest, still to
        advance."""
        done = advance.backend.terminated_batch(advance.grammars, advance.tokens)
        if not any(done):
            return advance
        rest = _Advance(advance.backend, [], [], [])
        for grammar, rid, tokens, finished in zip(advance.grammars, advance.request_ids, advance.tokens, done):
            if finished:
                self._drop(rid)
                if complete is not None:
                    complete.append(rid)
            else:
                rest.grammars.append(grammar)
                rest.request_ids.append(rid)
                rest.tokens.append(tokens)
        return rest

    def take_deferred_fill(self) -> bytearray | np.ndarray:
        """The bitmask :meth:`start_deferred_fill` started (waits for it), in the reused
        buffer: the executor consumes it before the next fill starts.

        Raises:
            RuntimeError: No fill was started.
        """
        if self._fill_job is None:
            raise RuntimeError("take_deferred_fill() without start_deferred_fill()")
        self._join_fill()
        return self._buffer

    def _join_fill(self) -> None:
        """Wait for the fill thread's job, if one runs (and restore the switch interval),
        and keep the refusals its advance found; a backend's exception in it is raised
        here."""
        job = self._fill_job
        if job is None:
            return
        self._fill_job = None
        if self._switch_interval:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = 0.0
        self._note_refused(job.result())

    def _advance_and_fill(self, advance: list[_Advance], bitmask: np.ndarray, groups: list) -> list[tuple[str, str]]:
        """The fill thread's job: the pending advance, then the fill."""
        refused = self._run_advance(advance, background=True)
        self._fill_groups(bitmask, groups)
        return refused

    def _advance_now(self) -> None:
        """Run the advance :meth:`accept` left pending, here (nothing took it to the fill
        thread)."""
        if self._advance:
            advance, self._advance = self._advance, []
            self._note_refused(self._run_advance(advance))

    @staticmethod
    def _run_advance(advance: list[_Advance], background: bool = False) -> list[tuple[str, str]]:
        """Advance grammars over their tokens, one call per backend (``background``: on
        the fill thread); the ``(id, reason)`` of each request whose grammar refused a
        token."""
        refused: list[tuple[str, str]] = []
        for backend, grammars_of, request_ids, tokens in advance:
            accepted = backend.accept_tokens_batch(grammars_of, request_ids, tokens, background=background)
            if not all(accepted):
                refused.extend((rid, _refusal(t)) for rid, t, ok in zip(request_ids, tokens, accepted) if not ok)
        return refused

    def _note_refused(self, refused: list[tuple[str, str]]) -> None:
        for rid, reason in refused:
            if rid in self._grammars:  # not finished meanwhile
                self._drop(rid)
                self._refused.append((rid, reason))

    @staticmethod
    def _fill_groups(bitmask: np.ndarray, groups: list) -> None:
        for backend, grammars_of, indices in groups:
            backend.fill_bitmasks(grammars_of, bitmask, indices)

    def _rows(self, n: int) -> np.ndarray:
        """``n`` bitmask rows over :attr:`_buffer`, the bytes that go to the workers.

        The buffer is reused while a step's row count stays the same (most steps), and
        crosses as it is, not copied into ``bytes`` (~1 ms a step at 256 rows of a
        151,936-token vocabulary): every executor consumes it before the engine core
        fills the next one (the worker copies it when it masks, an IPC or Ray call
        encodes it when sent).
        """
        import numpy as np

        words = (self.vocab_size + 31) // 32
        nbytes = n * words * 4
        if len(self._buffer) != nbytes:
            buffer = self._allocate_buffer(nbytes) if self._allocate_buffer is not None else None
            self._buffer = buffer if buffer is not None else bytearray(nbytes)
        return np.frombuffer(self._buffer, dtype=np.int32).reshape(n, words)

    def _by_backend(self, items: list[tuple[str, StructuredOutputGrammar, _T]]
                    ) -> list[tuple[StructuredOutputBackend, list[StructuredOutputGrammar], list[_T]]]:
        """``(request id, grammar, payload)`` items grouped by the backend that compiled
        each grammar, for one call per backend."""
        if len(self._backends) == 1:
            # One backend compiled every grammar (the usual case): no lookups per row.
            backend = next(iter(self._backends.values()))
            return [(backend, [g for _, g, _ in items], [p for _, _, p in items])] if items else []
        groups: dict[int, tuple[StructuredOutputBackend, list[StructuredOutputGrammar], list[_T]]] = {}
        backend_of = self._backend_of
        for rid, grammar, payload in items:
            backend = backend_of[rid]
            group = groups.setdefault(id(backend), (backend, [], []))
            group[1].append(grammar)
            group[2].append(payload)
        return list(groups.values())

    def _fill(self, bitmask: np.ndarray, rows: list[tuple[str, StructuredOutputGrammar, int]]) -> None:
        """Fill bitmask rows from grammars at their current state, one call per backend."""
        self._fill_groups(bitmask, self._by_backend(rows))

    def _fill_drafts(self, bitmask: np.ndarray, rows: list[tuple[str, StructuredOutputGrammar, int, list[int]]]
                     ) -> None:
        """The rows of the verified positions after each request's first (see
        :meth:`fill_bitmask`), given as ``(request id, grammar, first row, drafts)``."""
        drafts: list[list[int]] = [grammar.validate_tokens(d) if d else [] for _, grammar, _, d in rows]
        offsets = [offset for _, _, offset, _ in rows]
        advanced = [0] * len(rows)
        for j in range(max(len(d) for *_, d in rows)):
            to_fill = []
            for i, (rid, grammar, _, verified) in enumerate(rows):
                if j >= len(verified):
                    continue
                row = offsets[i] + j + 1
                if advanced[i] == j and j < len(drafts[i]):
                    grammar.accept_tokens(rid, [drafts[i][j]])
                    if grammar.is_terminated():
                        grammar.rollback(1)  # complete: its stop token may only come last
                    else:
                        advanced[i] += 1
                        to_fill.append((rid, grammar, row))
                        continue
                bitmask[row] = bitmask[offsets[i] + advanced[i]]
            self._fill(bitmask, to_fill)
        for (_, grammar, _, _), n in zip(rows, advanced):
            if n:
                grammar.rollback(n)

    def accept_early(self, kept: list[tuple[str, list[int]]], plan: SchedulerOutput, pending: Any = None) -> bool:
        """Take a collected step's tokens before the scheduler applies it, and start
        ``plan``'s deferred fill (the grammar process does: :class:`~forkless.structured_output.process.GrammarProcessClient`).
        Here: ``False``, nothing taken. The fill thread shares the step loop's interpreter
        lock, and starting its job before the scheduler's update measured no faster
        (benchmarks/README.md, "Where the mp step's overhead goes now")."""
        return False

    def accept(self, outputs: list[EngineCoreOutput],
               defer_advance: bool = False) -> tuple[list[str], list[tuple[str, str]]]:
        """Advance the grammars of a step's outputs.

        Args:
            outputs: The step's outputs.
            defer_advance: :meth:`start_deferred_fill` comes next: grammars whose
                backend declares ``completion_from_tokens`` are advanced there, on the
                fill thread (see the module's invariants).

        Returns:
            ``(complete, rejected)``: unfinished requests whose grammar is now complete
            (the caller finishes them with ``stop``), and ``(id, reason)`` of requests
            that sampled a token their grammar refuses (a backend fault; the caller fails
            them), including those a deferred advance found since the last call.
        """
        self._join_fill()
        self._advance_now()
        complete: list[str] = []
        rejected, self._refused = self._refused, []
        grammars = self._grammars
        thinking = self._thinking
        advancing = []
        for out in outputs:
            rid = out.request_id
            grammar = grammars.get(rid)
            if grammar is None:
                continue
            if out.finish_reason is not None:
                self._drop(rid)
                continue
            tokens = out.new_token_ids
            if thinking and rid in thinking:
                tokens = grammar_tokens(thinking, rid, tokens)
                if not tokens:
                    continue  # still thinking, or its grammar starts with the next token
            advancing.append((rid, grammar, (rid, tokens)))
        for backend, grammars_of, outs in self._by_backend(advancing):
            ids = [rid for rid, _ in outs]
            tokens = [t for _, t in outs]
            if defer_advance and backend.completion_from_tokens:
                later = self._drop_complete(_Advance(backend, grammars_of, ids, tokens), complete)
                if later.grammars:
                    self._advance.append(later)
                continue
            accepted = backend.accept_tokens_batch(grammars_of, ids, tokens)
            if not all(accepted):
                for rid, t, ok in zip(ids, tokens, accepted):
                    if not ok:
                        self._drop(rid)
                        rejected.append((rid, _refusal(t)))
                kept = [i for i, ok in enumerate(accepted) if ok]
                grammars_of, ids, tokens = [grammars_of[i] for i in kept], [ids[i] for i in kept], [tokens[i] for i in kept]
            for rid, done in zip(ids, backend.terminated_batch(grammars_of, tokens)):
                if done:
                    self._drop(rid)
                    complete.append(rid)
        return complete, rejected

    def finish(self, request_ids: Any) -> None:
        """Forget requests (finished, aborted, failed); unknown ids are ignored."""
        for rid in request_ids:
            self._drop(rid)
            future = self._compiling.pop(rid, None)
            if future is not None:
                future.cancel()

    def _drop(self, request_id: str) -> None:
        self._grammars.pop(request_id, None)
        self._backend_of.pop(request_id, None)
        self._thinking.pop(request_id, None)

    def shutdown(self) -> None:
        """Stop the compile and fill threads and release the backends."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._filler is not None:
            try:
                self._join_fill()  # the backends are destroyed next: no fill may run
            except Exception:  # noqa: BLE001 -- shutting down; the step that needed it is gone
                logger.debug("a bitmask fill failed during shutdown", exc_info=True)
            self._filler.shutdown(wait=False)
        for backend in self._backends.values():
            backend.destroy()
        # The buffer may be the executor's shared memory, which it unmaps next.
        self._buffer = bytearray()
