"""Output side of the engine: engine-core token ids -> ``RequestOutput`` (torch-free).

Per request it detokenizes incrementally, applies stop strings (the engine core knows
tokens, not text, so the caller must abort the ids returned in ``reqs_to_abort``), turns
logprobs into ``Logprob`` dicts, merges the ``n`` child requests of a parent, honours
``output_kind`` (cumulative, delta, final only) and records per-request timings (with
``log_stats``, vLLM's ``RequestStateStats`` too, shown as ``RequestOutput.metrics``).

A request aborted by its user-visible id can be given a last output (``abort_requests``'
``final_outputs``): what it had, its running completions finished with ``"abort"``, as
vLLM's, so that whoever streams it sees it end. Aborting every completion of a request by
its engine-core ids forgets the request too.

Prompt logprobs arrive with a child's first token; the parent keeps the first that
arrive (every child of a parent has the same prompt) and shows them in every output,
except under ``DELTA`` where only the first output that can carry them does.

Under ``DELTA`` with a stream interval above 1 (the larger of the engine's and the
request's ``stream_interval``, vLLM's rule) a completion shows in an output only with its
first tokens, once that many of its tokens are new, or when it finishes; the tokens of the
steps in between wait in it and come together. A step in which none of a parent's
completions shows makes no output for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from forkless.engine.detokenizer import IncrementalDetokenizer
from forkless.engine.stop_strings import StopStringMatcher
from forkless.metrics.stats import RequestStateStats, RequestTiming
from forkless.protocol.step import EngineCoreEventType
from forkless.outputs import CompletionOutput, Logprob, PoolingOutput, PoolingRequestOutput, PromptLogprobs, RequestOutput
from forkless.sampling_params import RequestOutputKind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from forkless.engine.processor import ProcessedRequest
    from forkless.protocol.step import EngineCoreOutput
    from forkless.sampling_params import SamplingParams


@dataclass
class OutputProcessorOutput:
    """Result of one :meth:`OutputProcessor.process_outputs` call.

    Attributes:
        request_outputs: One ``RequestOutput`` per parent request with news.
        reqs_to_abort: Engine-core ids finished by a stop string: abort them in the core.
        finished: Timings of completions that finished.
        first_tokens: Timings of completions that got their first token (their prompt is
            done; a pooling request's result counts as one): the batch's prompt tokens
            and times to first token.
        num_new_tokens: Tokens the step generated for requests still tracked (a request
            finished or aborted here may get one more from a step the core had begun;
            nobody sees it, so the metrics do not count it).
        inter_token_latencies: With ``log_stats``, one value per completion that got
            tokens here after earlier ones: seconds since its previous tokens came (vLLM's
            ``inter_token_latencies_iter``: a gap per output, not per token).
    """

    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_abort: list[str] = field(default_factory=list)
    finished: list[RequestTiming] = field(default_factory=list)
    first_tokens: list[RequestTiming] = field(default_factory=list)
    num_new_tokens: int = 0
    inter_token_latencies: list[float] = field(default_factory=list)


class _Completion:
    """State of one engine-core request (one of a parent's ``n`` completions)."""

    def __init__(self, request_id: str, index: int, params: SamplingParams, parent: _Parent,
                 tokenizer: PreTrainedTokenizerBase | None, stop: StopStringMatcher, log_stats: bool = False) -> None:
        self.request_id = request_id
        self.index = index
        self.params = params
        self.parent = parent
        self.detok = (
            IncrementalDetokenizer(tokenizer, parent.prompt_token_ids, params.skip_special_tokens,
                                   params.spaces_between_special_tokens)
            if tokenizer is not None and params.detokenize else None
        )
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_cached_tokens = 0
        # The KV connector's parameters for the client, from the finishing output.
        self.kv_transfer_params: dict[str, Any] | None = None
        self.stop = stop
        # The tokens whose text a request that they stop leaves out (see update).
        self.stop_token_ids = set() if params.include_stop_str_in_output else params.all_stop_token_ids
        # Text that could still be the start of a stop string is not shown before it is
        # known not to be one.
        self.hold_back = max(stop.max_length - 1, 0)
        self.sent_text = 0
        self.sent_tokens = 0
        # DELTA outputs: show this completion once this many of its tokens are new (see the module).
        self.stream_interval = 1
        # A pooling request's result (it arrives with the request's only output).
        self.pooled: Any = None
        self.stats = RequestStateStats(arrival_time=parent.arrival_time) if log_stats else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, out: EngineCoreOutput, now: float) -> bool:
        """Apply one engine-core output; returns True when a stop string finished it."""
        if out.new_prompt_logprobs is not None and self.parent.prompt_logprobs is None:
            self.parent.prompt_logprobs = self._prompt_logprobs(out.new_prompt_logprobs)
        # A pooling request's result is its first and last "token" (vLLM times every
        # output), so that its latency and phases are measured as a completion's.
        if out.new_token_ids or out.pooling_output is not None:
            if self.first_token_time is None:
                self.first_token_time = now
            self.last_token_time = now
        self.num_cached_tokens = out.num_cached_tokens
        if out.kv_transfer_params is not None:
            self.kv_transfer_params = out.kv_transfer_params
        if out.pooling_output is not None:
            self.pooled = out.pooling_output
        self.token_ids.extend(out.new_token_ids)
        if out.new_logprobs is not None and self.logprobs is not None:
            self._add_logprobs(out.new_logprobs)
        stopped_by_text = False
        if self.detok is not None:
            new_ids = out.new_token_ids
            # The engine core stops a request on a stop token (EOS or stop_token_ids): its
            # id stays in the output, its text does not unless include_stop_str_in_output
            # (vLLM's rule; a special token's text is empty anyway unless kept). A grammar
            # that completes also stops it ("stop"), on a token that is part of the output.
            # (FinishReason is a str enum: it equals its value.)
            trailing = int(bool(new_ids) and out.finish_reason == "stop" and new_ids[-1] in self.stop_token_ids)
            new_ids = new_ids[: len(new_ids) - trailing]
            # Several tokens at once (accepted speculative drafts) go one by one while stop
            # strings apply: the output ends at the token that completes one, as without
            # speculation.
            pieces = [[t] for t in new_ids] if self.stop and len(new_ids) > 1 else [new_ids]
            for after, piece in enumerate(reversed(range(len(pieces)))):
                piece += trailing  # tokens after this piece's
                new_text = self.detok.update(pieces[after])
                self.text += new_text
                # The first min_tokens tokens' text is never searched (vLLM's rule): a stop
                # string ends the output at the earliest at token min_tokens + 1, where a
                # stop token (masked until min_tokens tokens exist) could end it too.
                if self.stop and new_text and len(self.token_ids) - piece > self.params.min_tokens:
                    found = self.stop.find(self.text, len(new_text), self.params.include_stop_str_in_output)
                    if found is not None:
                        del self.token_ids[len(self.token_ids) - piece:]
                        self.stop_reason, keep = found
                        self.text = self.text[:keep]
                        stopped_by_text = out.finish_reason is None
                        self.finish_reason = "stop"
                        return stopped_by_text
        if out.finish_reason is not None:
            self.finish_reason = str(getattr(out.finish_reason, "value", out.finish_reason))
            self.stop_reason = out.stop_reason
        return stopped_by_text

    def update_stats(self, out: EngineCoreOutput, now: float, core_time: float) -> None:
        """Apply one engine-core output to :attr:`stats` (before :meth:`update`), as vLLM's
        ``IterationStats.update_from_output``."""
        stats = self.stats
        assert stats is not None
        if out.events:
            for event in out.events:
                if event.type == EngineCoreEventType.QUEUED:
                    stats.queued_ts = event.timestamp
                elif event.type == EngineCoreEventType.SCHEDULED and not stats.scheduled_ts:
                    stats.scheduled_ts = event.timestamp
        if not out.new_token_ids and out.pooling_output is None:
            return
        if self.first_token_time is None:
            stats.first_token_latency = now - stats.arrival_time
            stats.first_token_ts = core_time
        stats.last_token_ts = core_time
        stats.num_generation_tokens += len(out.new_token_ids)

    def _add_logprobs(self, raw: Any) -> None:
        assert self.logprobs is not None and self.cumulative_logprob is not None
        self.logprobs.append(self._logprob_entry(raw))
        self.cumulative_logprob += float(raw[1][0])

    def _logprob_entry(self, raw: Any) -> dict[int, Logprob]:
        # The runner sends [token_ids, logprobs, rank]: the sampled (or prompt) token
        # first with its own rank, then the top-n best first, ranked 1..n.
        ids, values, rank = raw
        entry: dict[int, Logprob] = {}
        for i, (tok, value) in enumerate(zip(ids, values)):
            if tok in entry:
                continue
            decoded = self.detok.decode_token(tok) if self.detok is not None else None
            entry[tok] = Logprob(logprob=float(value), rank=int(rank) if i == 0 else i, decoded_token=decoded)
        return entry

    def _prompt_logprobs(self, raw: list[Any]) -> PromptLogprobs:
        # One entry per prompt position 1..; the first prompt token has no distribution.
        return [None] + [None if r is None else self._logprob_entry(r) for r in raw]

    def make_output(self, kind: RequestOutputKind) -> CompletionOutput:
        visible = len(self.text) if self.finished else max(len(self.text) - self.hold_back, 0)
        if kind is RequestOutputKind.DELTA:
            text = self.text[self.sent_text:visible]
            token_ids = self.token_ids[self.sent_tokens:]
            logprobs = self.logprobs[self.sent_tokens:] if self.logprobs is not None else None
        else:
            text = self.text[:visible]
            token_ids = list(self.token_ids)
            logprobs = list(self.logprobs) if self.logprobs is not None else None
        self.sent_text = max(self.sent_text, visible)
        self.sent_tokens = len(self.token_ids)
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            lora_request=self.parent.lora_request,
        )

    def timing(self) -> RequestTiming:
        return RequestTiming(
            request_id=self.request_id,
            parent_id=self.parent.request_id,
            arrival_time=self.parent.arrival_time,
            first_token_time=self.first_token_time,
            last_token_time=self.last_token_time,
            num_prompt_tokens=len(self.parent.prompt_token_ids),
            num_generation_tokens=len(self.token_ids),
            num_cached_tokens=self.num_cached_tokens,
            finish_reason=self.finish_reason,
            stats=self.stats,
        )


class _Parent:
    """A user-visible request and its completions."""

    def __init__(self, processed: ProcessedRequest) -> None:
        self.request_id = processed.request_id
        self.prompt = processed.prompt
        self.prompt_token_ids = processed.prompt_token_ids
        self.arrival_time = processed.arrival_time
        self.kind = processed.params.output_kind
        self.children: list[_Completion] = []
        # Children not finished yet: counted down as each finishes (once: a finished
        # child takes no more outputs), so ``finished`` costs nothing per output.
        self.num_unfinished = 0
        self.prompt_logprobs: PromptLogprobs | None = None
        self.sent_prompt_logprobs = False
        self.pooling = processed.pooling_params is not None
        self.lora_request = processed.core_requests[0].lora_request if processed.core_requests else None

    def add_child(self, child: _Completion) -> None:
        self.children.append(child)
        self.num_unfinished += 1

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0

    def make_output(self, updated: list[_Completion]) -> RequestOutput | PoolingRequestOutput | None:
        finished = self.num_unfinished == 0
        if self.pooling:
            pooled = self.children[0].pooled
            if not finished or pooled is None:
                return None  # an aborted pooling request has no result to show
            return PoolingRequestOutput(self.request_id, PoolingOutput(pooled.to_numpy()), self.prompt_token_ids,
                                        self.children[0].num_cached_tokens)
        if self.kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = self.kind is RequestOutputKind.DELTA
        chosen = updated if delta else self.children
        prompt_logprobs = self.prompt_logprobs
        if delta and self.sent_prompt_logprobs:
            prompt_logprobs = None
        self.sent_prompt_logprobs |= prompt_logprobs is not None
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[c.make_output(self.kind) for c in
                     (chosen if len(chosen) == 1 else sorted(chosen, key=lambda c: c.index))],
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=self.children[0].num_cached_tokens,
            lora_request=self.lora_request,
            # (The first completion's that has any: a connector pairs one request, and
            # a request of n > 1 is n of them.)
            kv_transfer_params=next((c.kv_transfer_params for c in self.children
                                     if c.kv_transfer_params is not None), None) if finished else None,
            # As vLLM: the statistics of the completion whose news this is (the live
            # object, complete once the request is finished).
            metrics=updated[-1].stats,
        )


class OutputProcessor:
    """Tracks every in-flight request between the caller and the engine core.

    Args:
        tokenizer: For detokenization; ``None`` returns token ids only (empty text).
        log_stats: Keep a ``RequestStateStats`` per completion and show it as
            ``RequestOutput.metrics`` (vLLM's ``log_stats``); off, ``metrics`` is ``None``.
        stream_interval: The engine's ``stream_interval`` (``--stream-interval``): the least
            number of new tokens a ``DELTA`` output of a completion carries, but its first
            and last (see the module).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, log_stats: bool = False,
                 stream_interval: int = 1) -> None:
        self.tokenizer = tokenizer
        self.log_stats = log_stats
        self.stream_interval = stream_interval
        self._parents: dict[str, _Parent] = {}
        self._children: dict[str, _Completion] = {}

    def add_request(self, processed: ProcessedRequest) -> None:
        """Start tracking a request before its core requests are sent.

        Raises:
            ValueError: The request id is already in flight, or a stop string is too long.
        """
        if processed.request_id in self._parents:
            raise ValueError(f"request id {processed.request_id!r} is already in use")
        # Indexed once here, shared by the n completions (they have the same stop
        # strings): the per-step path only looks new text up in it.
        stop = StopStringMatcher(processed.params.stop or ())
        parent = _Parent(processed)
        interval = 1
        if parent.kind is RequestOutputKind.DELTA:
            interval = max(self.stream_interval, processed.params.stream_interval or 1)
        for index, core_req in enumerate(processed.core_requests):
            child = _Completion(core_req.request_id, index, core_req.sampling_params, parent, self.tokenizer, stop,
                                self.log_stats)
            child.stream_interval = interval
            parent.add_child(child)
            self._children[child.request_id] = child
        self._parents[parent.request_id] = parent

    def process_outputs(self, outputs: Iterable[EngineCoreOutput], now: float | None = None,
                        core_time: float | None = None) -> OutputProcessorOutput:
        """Apply one engine-core step's outputs.

        Args:
            outputs: ``EngineCoreOutputs.outputs``. Ids no longer tracked (aborted) are
                ignored.
            now: The time to record (default ``time.time()``).
            core_time: With ``log_stats``, the step's end on the engine core's monotonic
                clock (``EngineCoreOutputs.monotonic_timestamp``; default
                ``time.monotonic()``), for the first and last token times.

        Returns:
            The request outputs, the ids to abort in the core, and finished timings.
        """
        now = time.time() if now is None else now
        result = OutputProcessorOutput()
        updated: dict[str, list[_Completion]] = {}
        children_by_id = self._children
        final_only = RequestOutputKind.FINAL_ONLY
        num_new_tokens = 0
        log_stats = self.log_stats
        if log_stats and not core_time:
            core_time = time.monotonic()
        for out in outputs:
            child = children_by_id.get(out.request_id)
            if child is None or child.finish_reason is not None:
                continue
            num_new_tokens += len(out.new_token_ids)
            if log_stats:
                child.update_stats(out, now, core_time)
                if out.new_token_ids and child.last_token_time is not None:
                    result.inter_token_latencies.append(now - child.last_token_time)
            first = child.first_token_time is None and (bool(out.new_token_ids) or out.pooling_output is not None)
            if child.update(out, now):
                result.reqs_to_abort.append(child.request_id)
            if first:
                result.first_tokens.append(child.timing())
            parent = child.parent
            if child.finish_reason is not None:
                del children_by_id[child.request_id]
                parent.num_unfinished -= 1
                result.finished.append(child.timing())
            elif parent.kind is final_only:
                # Nothing to show until the whole parent finishes, and it has not: this
                # child is still running. The hot path of LLM.generate (one check).
                continue
            elif child.stream_interval > 1 and child.sent_tokens and \
                    len(child.token_ids) - child.sent_tokens < child.stream_interval:
                continue  # (DELTA) its new tokens wait for more: see the module
            children = updated.setdefault(parent.request_id, [])
            # One message may hold two outputs of a request (async scheduling can apply two
            # steps' results before sending): its completion must appear once, with both.
            if child not in children:
                children.append(child)
        for parent_id, children in updated.items():
            parent = self._parents[parent_id]
            request_output = parent.make_output(children)
            if request_output is not None:
                result.request_outputs.append(request_output)
            if parent.num_unfinished == 0:
                del self._parents[parent_id]
        result.num_new_tokens = num_new_tokens
        return result

    def abort_requests(self, request_ids: Iterable[str],
                       final_outputs: dict[str, RequestOutput | PoolingRequestOutput | None] | None = None
                       ) -> list[str]:
        """Stop tracking requests (user-visible ids or engine-core ids).

        An engine-core id names one completion of its request; the request is forgotten
        too once none of its completions is left running (nothing more can come for it,
        and ``has_unfinished_requests`` must not wait for it).

        Args:
            request_ids: The ids; unknown ones are ignored.
            final_outputs: When given, each request still in flight that is aborted by its
                user-visible id gets its last output here, under that id: its completions
                so far, those still running finished with ``"abort"`` (vLLM's last output
                of an aborted request), or ``None`` for a pooling request, which has no
                result to show.

        Returns:
            The engine-core ids to abort in the core.
        """
        to_abort: list[str] = []
        for rid in request_ids:
            parent = self._parents.pop(rid, None)
            if parent is not None:
                aborted = [c for c in parent.children if self._children.pop(c.request_id, None) is not None]
                to_abort += [c.request_id for c in aborted]
                if final_outputs is not None and aborted:
                    for child in aborted:
                        child.finish_reason = "abort"
                    parent.num_unfinished = 0
                    final_outputs[rid] = parent.make_output(aborted)
                continue
            child = self._children.pop(rid, None)
            if child is None:
                continue
            to_abort.append(rid)
            child.finish_reason = "abort"
            parent = child.parent
            parent.num_unfinished -= 1
            if parent.num_unfinished == 0 and self._parents.get(parent.request_id) is parent:
                del self._parents[parent.request_id]
        return to_abort

    def has_unfinished_requests(self) -> bool:
        """Whether any request is in flight."""
        return bool(self._parents)

    def get_num_unfinished_requests(self) -> int:
        """Number of user-visible requests in flight."""
        return len(self._parents)
