"""OpenAI's Responses API (``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``, ``GET /v1/responses/{id}/input_items``) on top of chat
completions.

Invariants:
    * A Responses request becomes one chat completions request (instructions first as a
      system message, then the stored conversation of ``previous_response_id``, then
      ``input``), served by :class:`OpenAIServing` exactly as ``/v1/chat/completions``
      is: the same template, parsers, limits and errors. vLLM's extensions of the
      request (``seed``, ``stop``, the penalties, ``structured_outputs``...) are the chat
      request's fields of the same names (:data:`_CHAT_FIELDS`). The chat answer (or its SSE
      chunks) is then rewritten into Responses output items (``reasoning``, ``message``,
      ``function_call``) or Responses stream events. A streamed message's logprobs (its
      ``output_text.delta`` events' and its final part's) are the unstreamed message's:
      every token's, the reasoning's, the function calls' and the EOS's included. So that
      the message has them all before it is done while items still stream one after the
      other, a function call that follows a message with logprobs is held back and
      streamed after it, at the end.
    * Fields forkless cannot honour (other tool types than ``function``,
      ``reasoning.summary``, image input...) are a 400 naming the field; an error from the
      chat path names the Responses field it came from (``max_output_tokens``, ``text``).
    * ``store`` (OpenAI's default: true) keeps the response and its conversation in
      memory for ``previous_response_id`` and ``GET``, at most
      ``FORKLESS_RESPONSES_STORE_SIZE`` responses and :data:`MAX_STORED_CHARS` characters
      of JSON, the oldest that has ended dropped first; nothing is written to disk, and a
      restart forgets them all. A stream is stored as it ended: ``failed`` (with its
      error) or ``cancelled`` (the client left) as well as ``completed`` / ``incomplete``.
    * ``background`` (with ``store``) answers at once with the response stored as
      ``queued`` (a constrained one too: a grammar the engine refuses ends it
      ``failed``); a task of the API server runs it as an internal stream
      (:meth:`OpenAIServingResponses._stream`, so it is stored as such a stream ends),
      ``in_progress`` once it starts. Cancelling, deleting or shutting down cancels the
      task and waits for it, which aborts the engine request before the store changes.
      While it has not ended it is never dropped from the store: a new one that finds
      the store full of running ones is a 429.
    * A background response's events are kept with it (:class:`ResponseEvents`, at most
      :data:`MAX_EVENT_CHARS` characters of them, and :data:`MAX_RUNNING_EVENT_CHARS`
      of all the running ones' together, the oldest dropped; once it has ended they
      count in the store's characters) and go with it. ``stream`` on the ``POST``
      and ``GET ...?stream=true&starting_after=N`` read them: those kept, then each as it
      comes, to the end, which a cut-short response marks with ``response.cancelled``.
      A reader is never the run: the client leaving ends the reader alone.
    * As in vLLM, ``item_reference`` input items and ``GET .../input_items`` are not
      served: each is a 400 that names it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

from pydantic import ValidationError

from forkless import envs
from forkless.logger import init_logger
from forkless.entrypoints.openai.errors import BadRequest, quoted
from forkless.entrypoints.openai.serving import refuse_unknown_fields, reject_field
from forkless.protocol.openai import ChatCompletionRequest, ChatCompletionResponse, ResponsesRequest

if TYPE_CHECKING:
    from forkless.entrypoints.openai.serving import OpenAIServing

logger = init_logger("forkless.entrypoints.openai")

# A chat field's error, renamed to the Responses field that set it.
_PARAM_NAMES = {"max_completion_tokens": "max_output_tokens", "response_format": "text", "messages": "input",
                "prompt": "input", "structured_outputs": "text", "reasoning_effort": "reasoning"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_REASONING_PARTS = ("reasoning_text", "summary_text")
# Fields of OpenAI's and vLLM's Responses requests that forkless does not implement: the
# values it accepts (those that change nothing), and why (as serving.reject_field takes
# them; the fields all endpoints refuse, such as ec_transfer_params, are refused too).
_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "conversation": ((None,), "chain responses with previous_response_id"),
    "prompt": ((None,), "prompt templates are not stored here; send input"),
    "max_tool_calls": ((None,), "the model's tool calls are not limited here"),
    # (OpenAI's has one key: include_obfuscation, whose false changes nothing here.)
    "stream_options": ((None, {}, {"include_obfuscation": False}),
                       "it takes include_obfuscation alone, and only false: no stream is obfuscated here (and a "
                       "streamed response always ends with its usage)"),
    "include_reasoning": ((None, True), "reasoning items are always returned"),
    "enable_response_messages": ((None, False), "the response's input and output messages are not returned"),
    "previous_input_messages": ((None,), "chain responses with previous_response_id"),
    "kv_transfer_params": ((None,), "a KV connector's parameters are taken by /v1/completions and "
                                    "/v1/chat/completions, not here"),
}
# (OpenAI's reasoning.encrypted_content is refused: nothing here encrypts reasoning for a
# stateless next turn; previous_response_id chains with the stored reasoning.)
_INCLUDABLE = ("message.output_text.logprobs",)
# Responses fields that are chat completions fields of the same name and meaning.
_CHAT_FIELDS = ("model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "logit_bias", "seed", "stop", "ignore_eos", "skip_special_tokens",
                "include_stop_str_in_output", "structured_outputs", "chat_template_kwargs", "user", "request_id",
                "priority", "cache_salt", "parallel_tool_calls", "extra_args", "vllm_xargs")
# The stored responses' JSON, at most (their conversations included).
MAX_STORED_CHARS = 256 << 20
# A background response's statuses before it ends.
_UNFINISHED = ("queued", "in_progress")
# The characters of events one background response keeps (the oldest dropped past them).
MAX_EVENT_CHARS = 16 << 20
# ... and all the running ones together (an ended one's count in the store's characters).
MAX_RUNNING_EVENT_CHARS = 256 << 20
# The events that end a response's stream.
_FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesStore:
    """Stored responses and the conversations they end, the oldest dropped past ``size``
    responses or past :data:`MAX_STORED_CHARS` characters of JSON in all (so that many
    long conversations cannot exhaust the API server's memory).

    A background response that has not ended (``queued``, ``in_progress``) is never
    dropped: the ended ones go first, and a new one that finds no room once they are all
    gone is refused (a 429). Its events (:class:`ResponseEvents`) are kept with it and
    go when it goes; once it has ended they count towards ``max_chars`` too
    (:meth:`settle`)."""

    def __init__(self, size: int, max_chars: int = MAX_STORED_CHARS) -> None:
        self.size = size
        self.max_chars = max_chars
        self._chars = 0
        self._items: OrderedDict[str, _Stored] = OrderedDict()
        # The entries of background responses not ended yet, which are never dropped.
        self._running: set[str] = set()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]],
            events: "ResponseEvents | None" = None) -> None:
        """Store ``response`` (replacing the entry of the same id), then drop the oldest
        ended ones while the store is over its bounds.

        Args:
            events: The background response's events; ``None`` keeps those it had.

        Raises:
            BadRequest: 429, ``response`` is a new unfinished one and the running ones
                leave it no room.
        """
        response_id = response["id"]
        chars = len(json.dumps(response)) + len(json.dumps(conversation))
        running = response.get("status") in _UNFINISHED
        old = self._items.get(response_id)
        if running and old is None:
            self.check_room(chars)
        if old is not None:
            self._remove(response_id)
            events = old.events if events is None else events
        if self.size <= 0 or chars > self.max_chars:
            return
        self._items[response_id] = _Stored(response, conversation, chars, events)
        self._chars += chars
        if running:
            self._running.add(response_id)
        self._shrink()

    def check_room(self, chars: int = 0) -> None:
        """Check that a new background response of ``chars`` characters can be stored.

        Raises:
            BadRequest: 429, the background responses running fill the store.
        """
        running_chars = sum(self._items[rid].chars for rid in self._running)
        if len(self._running) >= self.size or running_chars + chars > self.max_chars:
            raise BadRequest(f"too many background responses running: the response store keeps them all until they "
                             f"end, and those running fill it ({len(self._running)} of at most {self.size}, "
                             "FORKLESS_RESPONSES_STORE_SIZE, and of its characters); retry once one has ended",
                             "background", status=429, err_type="RateLimitError")

    def settle(self, response_id: str) -> None:
        """Count an ended background response's events in the store's characters (they
        are not while it runs: :class:`EventBudget` bounds them), dropping the oldest
        ended responses for them; events that alone would not fit are dropped, the
        response kept."""
        entry = self._items.get(response_id)
        if entry is None or entry.events is None or response_id in self._running:
            return
        base = len(json.dumps(entry.response)) + len(json.dumps(entry.conversation))
        self._chars -= entry.chars
        entry.chars = base + entry.events.chars
        if entry.chars > self.max_chars:
            entry.events, entry.chars = None, base
        self._chars += entry.chars
        self._shrink()

    def _shrink(self) -> None:
        """Drop the oldest ended responses while the store is over its bounds (running
        ones are never dropped: ``put`` takes a new one only when there is room)."""
        while len(self._items) > self.size or self._chars > self.max_chars:
            oldest = next((rid for rid in self._items if rid not in self._running), None)
            if oldest is None:
                return
            self._remove(oldest)

    def _remove(self, response_id: str) -> None:
        self._chars -= self._items.pop(response_id).chars
        self._running.discard(response_id)

    def get(self, response_id: str, param: str = "response_id") -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The response and its conversation (chat messages, the output's included).

        Raises:
            BadRequest: 404, no such stored response.
        """
        found = self._items.get(response_id)
        if found is None:
            raise BadRequest(f"no stored response {response_id!r} (responses are kept in memory, at most "
                             f"{self.size} of them: FORKLESS_RESPONSES_STORE_SIZE)", param, status=404,
                             err_type="NotFoundError")
        return found.response, found.conversation

    def events(self, response_id: str) -> "ResponseEvents | None":
        """A stored background response's events (``None`` for another response, or
        when its events did not fit the store)."""
        found = self._items.get(response_id)
        return found.events if found is not None else None

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        self._remove(response_id)


@dataclass
class EventBudget:
    """The characters of events the running background responses keep, together."""

    limit: int = MAX_RUNNING_EVENT_CHARS
    chars: int = 0


@dataclass
class _Stored:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    chars: int  # the JSON's characters (and, once it has ended, its events')
    events: "ResponseEvents | None"


class ResponseEvents:
    """The events of a background response's stream (SSE text, numbered from 0 by
    ``sequence_number``), kept for ``POST`` with ``stream`` and ``GET ...?stream=true``:
    readers (:meth:`follow`) replay those kept and wait for the next ones.

    At most ``max_chars`` characters of them are kept, and, while the response runs, at
    most ``budget.limit`` characters of every running response's together (so that many
    long background responses cannot exhaust the API server's memory): past either the
    adding response's oldest are dropped (a quarter of them at a time, and at least the
    excess), so that a replay from before the oldest kept is refused and a reader that
    falls that far behind is ended with an ``error`` event. Ending gives the events'
    characters back to the budget (the store counts them then).
    """

    def __init__(self, max_chars: int = MAX_EVENT_CHARS, budget: "EventBudget | None" = None) -> None:
        self.max_chars = max_chars
        self.budget = budget
        self.chars = 0
        self.first = 0  # the sequence number of events[0]
        self.events: list[str] = []
        self.last_type: str | None = None
        self.ended = False
        self._added = asyncio.Event()  # set (and replaced) when an event comes or the stream ends

    @property
    def next_sequence(self) -> int:
        return self.first + len(self.events)

    @property
    def _bound(self) -> str:
        return f"{self.max_chars >> 20} M" if self.max_chars >= 1 << 20 else str(self.max_chars)

    def add(self, event: str) -> None:
        """Keep the next event (``event: TYPE\\ndata: {...}\\n\\n``) and wake the readers."""
        self.events.append(event)
        self.chars += len(event)
        self.last_type = event[len("event: "):event.index("\n")]
        over = self.chars - self.max_chars
        if self.budget is not None:
            self.budget.chars += len(event)
            over = max(over, self.budget.chars - self.budget.limit)
        if over > 0:
            keep = min(self.chars - over, self.max_chars) * 3 // 4
            drop = 0
            before = self.chars
            while drop < len(self.events) - 1 and self.chars > keep:
                self.chars -= len(self.events[drop])
                drop += 1
            del self.events[:drop]
            self.first += drop
            if self.budget is not None:
                self.budget.chars -= before - self.chars
        self._wake()

    def end(self) -> None:
        """No more events come: the readers end after the last."""
        self.ended = True
        if self.budget is not None:
            self.budget.chars -= self.chars
            self.budget = None
        self._wake()

    def _wake(self) -> None:
        self._added.set()
        self._added = asyncio.Event()

    def check_after(self, starting_after: int) -> None:
        """Raises:
            BadRequest: The events after ``starting_after`` are no longer all kept.
        """
        if starting_after + 1 < self.first:
            raise BadRequest(f"starting_after={starting_after}: the events before {self.first} are no longer kept "
                             f"(a background response keeps its last {self._bound} characters of events); "
                             f"start after {self.first - 1} or later, or GET the response without stream",
                             "starting_after")

    async def follow(self, starting_after: int) -> AsyncIterator[str]:
        """The events numbered above ``starting_after``: those kept, then each as it
        comes, until the stream's end."""
        sequence = starting_after + 1
        while True:
            while sequence < self.next_sequence:
                if sequence < self.first:  # dropped while this reader was behind
                    yield _event("error", sequence, code="events_dropped", param=None, message=(
                        f"this reader fell behind: the events from {sequence} to {self.first - 1} were dropped "
                        f"(a background response keeps its last {self._bound} characters of events); "
                        f"GET the response for its state"))
                    return
                yield self.events[sequence - self.first]
                sequence += 1
            if self.ended:
                return
            await self._added.wait()


def _event(kind: str, sequence: int, **fields: Any) -> str:
    """One Responses SSE event."""
    body = {"type": kind, "sequence_number": sequence, **fields}
    return f"event: {kind}\ndata: {json.dumps(body)}\n\n"


@dataclass
class _BackgroundRun:
    """A background response's task, and whether its coroutine has started (a task
    cancelled before that never runs its body, so its stream would never be closed)."""

    task: "asyncio.Task[None]"
    started: asyncio.Event


class OpenAIServingResponses:
    """``/v1/responses`` through an :class:`OpenAIServing`'s chat completions."""

    def __init__(self, chat: "OpenAIServing") -> None:
        self.chat = chat
        self.store = ResponsesStore(envs.FORKLESS_RESPONSES_STORE_SIZE)
        # Background responses still running, by response id.
        self._background: dict[str, _BackgroundRun] = {}
        self._event_budget = EventBudget()

    # -- request -------------------------------------------------------------------------
    def _chat_request(self, req: ResponsesRequest) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
        """The chat completions request, and the conversation (without instructions) it holds."""
        if req.background:
            # As OpenAI's: a background response is only ever seen through the store.
            if req.store is False:
                raise BadRequest("background responses must be stored (store: true): their result is read with "
                                 "GET /v1/responses/{id}", "store")
            if self.store.size <= 0:
                raise BadRequest("background responses need the response store, which FORKLESS_RESPONSES_STORE_SIZE"
                                 "=0 turns off on this server", "background")
            # (Refused before the engine takes it; storing it checks again.)
            self.store.check_room()
        extra = req.model_extra or {}
        if extra.get("stream_options") is not None and not req.stream:
            raise BadRequest("stream_options can only be given with stream=true", "stream_options")
        refuse_unknown_fields([name for name, value in extra.items() if not reject_field(name, value, _REFUSED)],
                              [*type(req).model_fields, *_REFUSED])
        # effort goes to the chat template (chat's reasoning_effort); OpenAI's other keys
        # (summary, generate_summary) and any other are not honoured.
        for key, value in (req.reasoning or {}).items():
            if value is not None and key != "effort":
                raise BadRequest(f"reasoning.{key} is not supported: a reasoning model thinks as its chat template "
                                 "says, and its reasoning comes back whole", "reasoning")
        if req.service_tier not in (None, "auto", "default"):
            raise BadRequest(f"service_tier {req.service_tier!r} is not supported: this server has one tier "
                             "(auto / default)", "service_tier")
        for key in (req.text or {}):
            if key != "format" and (req.text or {})[key] is not None:
                raise BadRequest(f"text.{key} is not supported (text takes format)", "text")
        _check_metadata(req.metadata)
        for name in req.include or []:
            if name not in _INCLUDABLE:
                raise BadRequest(f"include {name!r} is not supported (supported: {', '.join(_INCLUDABLE)})",
                                 "include")
        conversation: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            previous, stored = self.store.get(req.previous_response_id, "previous_response_id")
            if previous["status"] in _UNFINISHED:
                raise BadRequest(f"previous response {req.previous_response_id!r} is still {previous['status']}: "
                                 "wait until it has ended", "previous_response_id")
            conversation = list(stored)
        conversation += _input_messages(req.input)
        messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
        fields: dict[str, Any] = {name: getattr(req, name) for name in _CHAT_FIELDS}
        # A background response runs as a stream that no client reads (see _stream).
        streamed = bool(req.stream or req.background)
        fields.update(messages=messages, max_completion_tokens=req.max_output_tokens, stream=streamed,
                      reasoning_effort=(req.reasoning or {}).get("effort"))
        # As OpenAI's and vLLM's: logprobs come only when include asks for them, top_logprobs
        # says how many alternatives each token then has.
        if "message.output_text.logprobs" in (req.include or []):
            fields.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
        if streamed:
            # Usage in every chunk: a stream that fails or is left is stored with the
            # tokens it had so far.
            fields["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if req.tools:
            fields["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
        if req.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(req.tool_choice)
        if req.text is not None and req.text.get("format") is not None:
            fields["response_format"] = _response_format(req.text["format"])
            if req.structured_outputs is not None and fields["response_format"]["type"] != "text":
                raise BadRequest("give one of text.format and structured_outputs, not both", "structured_outputs")
        try:
            return ChatCompletionRequest(**{k: v for k, v in fields.items() if v is not None}), conversation
        except ValidationError as exc:  # a malformed tool, format or value
            first = exc.errors()[0]
            field = str(first["loc"][0]) if first.get("loc") else None
            param = _PARAM_NAMES.get(field or "", field)
            where = ".".join(str(p) for p in first.get("loc", ())[1:])
            raise BadRequest(f"invalid {param}{'.' + where if where else ''}: {first['msg']}", param) from None

    async def _fit_context(self, chat_req: ChatCompletionRequest, keep: int) -> ChatCompletionRequest:
        """``truncation: "auto"``, as OpenAI's: the conversation's oldest items are dropped
        (never the first ``keep`` messages, the instructions; a tool call's results go with
        it) until the prompt leaves room for ``max_output_tokens`` (else for one token).
        The fewest items are dropped, found by bisection over where the kept part starts;
        if the last item alone does not fit, the request fails as any too long one does."""
        room = self.chat.max_model_len - (chat_req.max_completion_tokens or 1)
        messages = list(chat_req.messages)

        def starting_at(cut: int) -> ChatCompletionRequest:
            return chat_req.model_copy(update={"messages": messages[:keep] + messages[cut:]})

        async def fits(cut: int) -> bool:
            ids = await self.chat.in_tokenizer_thread(self.chat.render_chat, starting_at(cut), "/v1/responses")
            return len(ids) <= room

        cuts = [c for c in range(keep, len(messages)) if messages[c].role != "tool"]
        if not cuts or await fits(cuts[0]):
            return chat_req
        low, high = 1, len(cuts) - 1  # the answer is in cuts[low:high + 1]; the last is kept regardless
        while low < high:
            middle = (low + high) // 2
            if await fits(cuts[middle]):
                high = middle
            else:
                low = middle + 1
        return starting_at(cuts[high]) if cuts[1:] else chat_req

    async def create(self, req: ResponsesRequest, raw_request: Any) -> Any:
        """The response (a dict), or its stream of SSE events.

        Raises:
            BadRequest: The request is invalid (``param`` names its Responses field).
        """
        chat_req, conversation = self._chat_request(req)
        if req.truncation == "auto":
            chat_req = await self._fit_context(chat_req, keep=1 if req.instructions else 0)
        # Made here, never taken from the client (X-Request-Id, request_id name the engine
        # request): a stored response is not overwritten by another with the same id.
        response_id = _id("resp")
        try:
            # A background response answers at once: a constraint the engine refuses
            # after taking it ends it failed (a stream's first output would be waited for,
            # to make that refusal a 400).
            result = await self.chat.create_chat_completion(chat_req, raw_request, "/v1/responses",
                                                            with_cached_tokens=True, with_reasoning_tokens=True,
                                                            wait_for_start=not req.background)
        except BadRequest as exc:
            if exc.param == "structured_outputs" and req.structured_outputs is not None:
                raise  # the request's own structured_outputs, not text.format's
            if exc.param == "structured_outputs" and req.tools and req.tool_choice not in (None, "auto", "none"):
                exc.param = "tools"  # the forced tool's parameters schema is the constraint
            if exc.param in _PARAM_NAMES:
                exc.message = exc.message.replace(exc.param, _PARAM_NAMES[exc.param])
                exc.param = _PARAM_NAMES[exc.param]
            raise
        if req.background:
            queued, events = await self._start_background(req, result, conversation, response_id, chat_req.logprobs)
            # Its events from the first: the client leaving ends this reader, not the response.
            return events.follow(-1) if req.stream else queued
        if req.stream:
            return self._stream(req, result, conversation, response_id, chat_req.logprobs)
        assert isinstance(result, ChatCompletionResponse)
        choice = result.choices[0]
        message = choice.message
        items = _output_items(message.reasoning, message.content, [
            {"call_id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls], _content_logprobs(choice.logprobs) if chat_req.logprobs else None)
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        items[-1]["status"] = status  # (the item the output was cut in, as OpenAI marks it)
        response = self._response(req, items, status, result.usage.model_dump() if result.usage else None,
                                  response_id)
        self._remember(req, response, conversation)
        return response

    def retrieve(self, response_id: str, query: dict[str, str] | None = None) -> dict[str, Any] | AsyncIterator[str]:
        """A stored response: as it ended, or a background response as it stands now
        (``queued``, ``in_progress``, then as it ended); with ``stream=true``, a background
        response's events (SSE), those kept then the next ones as they come, to its end.

        Args:
            response_id: Its id.
            query: The request's query parameters: OpenAI's ``stream`` (a boolean),
                ``starting_after`` (with ``stream``: the sequence number after which the
                events start, -1 or none for the first) and ``include_obfuscation``
                (``false`` only: no stream is obfuscated here). ``include``, which adds
                output to a stored response, is refused, not ignored (an unknown
                parameter too).

        Raises:
            BadRequest: 404, no such stored response; 400, a query parameter, or
                ``stream`` for a response whose events are not kept.
        """
        found = self.store.get(response_id)[0]
        query = dict(query or {})
        stream = _query_bool(query, "stream")
        if _query_bool(query, "include_obfuscation"):
            raise BadRequest("include_obfuscation=true is not supported: this server does not obfuscate streams "
                             "(include_obfuscation=false changes nothing)", "include_obfuscation")
        starting_after = query.pop("starting_after", None)
        for name in query:
            raise BadRequest(f"GET /v1/responses/{{id}}?{name}=... is not supported here: a stored response is "
                             "returned as it stands", name)
        if starting_after is not None and not stream:
            raise BadRequest("starting_after says where a stream of the response's events starts: it needs "
                             "stream=true", "starting_after")
        if not stream:
            return found
        after = -1 if starting_after is None else _sequence_number(starting_after)
        events = self.store.events(response_id)
        if events is None:
            why = ("it was not made in the background (background: true), and only a background response's events "
                   "are kept" if not found.get("background") else
                   "its events were too large to keep in the response store")
            raise BadRequest(f"cannot stream response {response_id!r}: {why}; GET it without stream", "stream")
        events.check_after(after)
        return events.follow(after)

    async def delete(self, response_id: str) -> dict[str, Any]:
        """Delete a stored response; a background one still running is cancelled first
        (its engine request aborted), so that it does not come back when it ends.

        Raises:
            BadRequest: 404, no such stored response.
        """
        self.store.get(response_id)
        await self._stop_background(response_id)
        self.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Cancel a background response that is ``queued`` or ``in_progress``: its engine
        request is aborted and it is stored ``cancelled``, with the output made so far.
        Cancelling one that is cancelled already returns it again.

        Raises:
            BadRequest: 404, no such stored response; else 400, as vLLM's, for a response
                that was not made in the background or has ended otherwise.
        """
        response = self.store.get(response_id)[0]
        if not response.get("background"):
            raise BadRequest("cannot cancel a synchronous response: only background responses (background: "
                             "true) can be cancelled", "response_id")
        # By the stored status: a run whose task has just ended may still be in
        # _background until its done-callback runs.
        if response["status"] not in (*_UNFINISHED, "cancelled"):
            raise BadRequest(f"cannot cancel response {response_id!r}: it has ended ({response['status']})",
                             "response_id")
        await self._stop_background(response_id)
        return self.store.get(response_id)[0]

    @property
    def num_background(self) -> int:
        """How many background responses are still running."""
        return len(self._background)

    async def shutdown(self) -> None:
        """Cancel every background response still running (the server is stopping):
        each is stored ``cancelled`` and its engine request aborted."""
        running = list(self._background)
        await asyncio.gather(*(self._stop_background(rid) for rid in running))
        if running:
            logger.info("cancelled %d background response(s) still running", len(running))

    # -- background ----------------------------------------------------------------------
    async def _start_background(self, req: ResponsesRequest, chunks: AsyncIterator[str],
                                conversation: list[dict[str, Any]], response_id: str,
                                with_logprobs: bool) -> tuple[dict[str, Any], ResponseEvents]:
        """Store the response as ``queued`` and start the task that runs its chat stream.

        Returns:
            The queued response, and the events the task keeps.

        Raises:
            BadRequest: 429, the background responses running fill the store (the chat
                stream is closed, which aborts its engine request).
        """
        created = int(time.time())
        queued = self._response(req, [], "queued", None, response_id, created)
        queued["usage"] = None  # (as a stream's first events say: nothing counted yet)
        events = ResponseEvents(budget=self._event_budget)
        try:
            self.store.put(queued, conversation, events)
        except BadRequest:
            await chunks.aclose()  # type: ignore[attr-defined]
            raise
        started = asyncio.Event()
        task = asyncio.create_task(self._run_background(req, chunks, conversation, response_id, with_logprobs,
                                                        created, started, events), name=f"background {response_id}")
        self._background[response_id] = _BackgroundRun(task, started)
        task.add_done_callback(lambda t: self._background_done(response_id, t))
        return dict(queued), events

    async def _run_background(self, req: ResponsesRequest, chunks: AsyncIterator[str],
                              conversation: list[dict[str, Any]], response_id: str, with_logprobs: bool,
                              created: int, started: asyncio.Event, kept: ResponseEvents) -> None:
        """Read the chat stream as a streamed response's events into ``kept``:
        :meth:`_stream` stores the response as it ends (``completed``, ``incomplete``,
        ``failed``, or ``cancelled`` when this task is cancelled)."""
        started.set()
        events = None
        cut: tuple[str, str | None] = ("failed", "internal error")  # (see _end_events)
        try:
            in_progress = self._response(req, [], "in_progress", None, response_id, created)
            in_progress["usage"] = None
            self.store.put(in_progress, conversation)
            events = self._stream(req, chunks, conversation, response_id, with_logprobs, created)
            async for event in events:
                kept.add(event)
        except asyncio.CancelledError:
            cut = ("cancelled", None)
            raise
        except Exception as exc:
            cut = ("failed", f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:
            # (Closing the events closes the chat stream, which aborts the engine request.)
            await (events if events is not None else chunks).aclose()  # type: ignore[attr-defined]
            self._end_events(response_id, kept, *cut)

    def _end_events(self, response_id: str, kept: ResponseEvents, status: str, error: str | None) -> None:
        """End a background response's events. A stream cut short (cancelled: by
        ``cancel``, ``DELETE`` or the server stopping) ends with the event of the status
        it was stored with, ``response.cancelled``, so that its readers see how it ended;
        one that never stored its end (a failure before its stream started) is stored
        ``status`` first, so that it does not stay running, and in the store, for ever."""
        if kept.last_type not in _FINAL_EVENTS:
            try:
                response, conversation = self.store.get(response_id)
            except BadRequest:
                response = None
            if response is not None and response["status"] in _UNFINISHED:
                response = {**response, "status": status,
                            "error": {"code": "server_error", "message": error} if error else None}
                self.store.put(response, conversation)
            if response is not None:
                kept.add(_event(f"response.{response['status']}", kept.next_sequence, response=response))
        kept.end()
        self.store.settle(response_id)

    def _background_done(self, response_id: str, task: "asyncio.Task[None]") -> None:
        self._background.pop(response_id, None)
        if not task.cancelled() and task.exception() is not None:
            # _stream stores every failure it sees as failed; this is one it could not.
            logger.error("background response %s failed", response_id, exc_info=task.exception())

    async def _stop_background(self, response_id: str) -> None:
        """Cancel a background response's task, if it still runs, and wait for it: the
        chat stream's close aborts the engine request, and the response is stored
        ``cancelled`` before this returns."""
        run = self._background.get(response_id)
        if run is None:
            return
        # Cancelled before its first step, the coroutine would never run, and the chat
        # stream (already in the engine, for a constrained request) never be closed.
        while not run.started.is_set() and not run.task.done():
            await asyncio.sleep(0)
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)

    def input_items(self, response_id: str) -> dict[str, Any]:
        """List a stored response's input items: not served, as in vLLM.

        Raises:
            BadRequest: 404, no such stored response; else 400 naming the route.
        """
        self.store.get(response_id)
        raise BadRequest("listing a response's input items (GET /v1/responses/{id}/input_items) is not supported: "
                         "input items are not stored one by one here (GET /v1/responses/{id} returns the response "
                         "and its output)", "response_id")

    # -- response ------------------------------------------------------------------------
    def _response(self, req: ResponsesRequest, output: list[dict[str, Any]], status: str,
                  usage: dict[str, Any] | None, response_id: str | None = None, created_at: int | None = None
                  ) -> dict[str, Any]:
        """The response object.

        Args:
            usage: The chat completion's usage (a dict, as its JSON), or None for zeros.
        """
        usage = usage or {}
        input_tokens, output_tokens = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        # The prefix cache's hits, as vLLM's Responses API reports them (the chat path
        # counts them for this endpoint alone).
        cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        # The reasoning's tokens, as vLLM counts them: the reasoning parser's count of the
        # output's tokens (0 without one). A stream has them in its last usage only.
        reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
        fmt = (req.text or {}).get("format") or {"type": "text"}
        # What it sampled with, as vLLM's: the request's, else the model's default, else 1.
        defaults = self.chat.sampling_defaults
        temperature, top_p = ((getattr(req, name) if getattr(req, name) is not None else defaults.get(name, 1.0))
                              for name in ("temperature", "top_p"))
        return {
            "id": response_id or _id("resp"), "object": "response", "created_at": created_at or int(time.time()),
            "status": status, "completed_at": int(time.time()) if status == "completed" else None,
            "background": bool(req.background), "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": req.model or self.chat.model_name, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
            "store": req.store is not False,
            # (OpenAI's default: "auto" with tools, "none" without, as the chat request got it.)
            "temperature": temperature, "text": {"format": fmt},
            "tool_choice": req.tool_choice or ("auto" if req.tools else "none"),
            "tools": req.tools or [], "top_logprobs": req.top_logprobs, "top_p": top_p,
            "truncation": req.truncation or "disabled",
            "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
                      "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                      "total_tokens": input_tokens + output_tokens},
            "user": req.user, "metadata": req.metadata or {},
        }

    def _remember(self, req: ResponsesRequest, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        if req.store is not False:
            self.store.put(response, conversation + _assistant_messages(response["output"]))

    async def _stream(self, req: ResponsesRequest, chunks: AsyncIterator[str], conversation: list[dict[str, Any]],
                      response_id: str, with_logprobs: bool, created: int | None = None) -> AsyncIterator[str]:
        """The chat stream's chunks, rewritten as Responses events.

        With ``store``, the response is stored as the stream ends it, before its last
        event: ``completed`` or ``incomplete``; ``failed``, with the error, when the chat
        stream ends with one; ``cancelled``, with the output so far, when the client leaves
        (or the server cancels the stream) before the end, as OpenAI's are.

        Args:
            created: When the response was made (a background response's, when it was
                queued); else now.
        """
        events = _EventWriter()
        created = created or int(time.time())
        shell = self._response(req, [], "in_progress", None, response_id, created)
        shell["usage"] = None
        yield events.emit("response.created", response=shell)
        yield events.emit("response.in_progress", response=shell)
        builder = _StreamedOutput(events, with_logprobs)
        finish, usage = None, None
        stored = False  # the response's end is stored: a close after it changes nothing
        try:
            async for raw in chunks:
                for data in _sse_data(raw):
                    if data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        closing = builder.close()
                        error = chunk["error"]
                        failed = self._failed(req, builder.items, usage, response_id, created, conversation,
                                              error.get("message"))
                        stored = True
                        for event in closing:
                            yield event
                        yield events.emit("error", code=str(error.get("code")), message=error.get("message"),
                                          param=error.get("param"))
                        yield events.emit("response.failed", response=failed)
                        return
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        for event in builder.delta(choice.get("delta") or {}, choice.get("logprobs")):
                            yield event
                        finish = choice.get("finish_reason") or finish
            status = "incomplete" if finish == "length" else "completed"
            closing = builder.close(status)
            response = self._response(req, builder.items, status, usage, response_id, created)
            self._remember(req, response, conversation)
            stored = True
            for event in closing:
                yield event
            yield events.emit(f"response.{status}", response=response)
        except (asyncio.CancelledError, GeneratorExit):
            # The client left (or the server is stopping): the chat stream's own close
            # aborts the engine request; what was streamed so far is kept, unfinished.
            if not stored:
                for item in builder.items:
                    if item["status"] == "in_progress":
                        item["status"] = "incomplete"
                self._remember(req, self._response(req, builder.items, "cancelled", usage, response_id, created),
                               conversation)
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in making the events: the client is told
            # The response has started (a 200 and its first events are sent): without this
            # the connection would just drop and nothing be stored. The events' state is
            # not to be trusted now, so no item is closed: those still open end incomplete.
            logger.error("Responses stream %s failed", response_id, exc_info=exc)
            message = f"internal error: {type(exc).__name__}: {exc}"
            for item in builder.items:
                if item["status"] == "in_progress":
                    item["status"] = "incomplete"
            failed = self._failed(req, builder.items, usage, response_id, created, conversation, message)
            yield events.emit("error", code="500", message=message, param=None)
            yield events.emit("response.failed", response=failed)
        finally:
            # Ends the chat stream, which aborts the engine request if it is still running
            # (a failure above left it unread).
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    def _failed(self, req: ResponsesRequest, items: list[dict[str, Any]], usage: dict[str, Any] | None,
                response_id: str, created: int, conversation: list[dict[str, Any]], message: str | None
                ) -> dict[str, Any]:
        """The ``failed`` response (stored, with ``store``) of a stream that ended on an error."""
        failed = self._response(req, items, "failed", usage, response_id, created)
        failed["error"] = {"code": "server_error", "message": message}
        self._remember(req, failed, conversation)
        return failed


class _EventWriter:
    """Responses SSE events, numbered in order (``sequence_number``)."""

    def __init__(self) -> None:
        self.sequence = 0

    def emit(self, kind: str, **fields: Any) -> str:
        self.sequence += 1
        return _event(kind, self.sequence - 1, **fields)


class _StreamedOutput:
    """The output items of a streamed response, opened and closed as the chat deltas
    switch between reasoning, text and tool calls."""

    def __init__(self, events: _EventWriter, with_logprobs: bool) -> None:
        self.events = events
        self.with_logprobs = with_logprobs
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its item
        # Logprobs of tokens that came while no message was open (reasoning, or an answer
        # that has not started): the next message gets them, as an unstreamed response's
        # message has every token's logprobs.
        self.pending_logprobs: list[dict[str, Any]] = []
        # Chat tool-call deltas held back until the open message with logprobs is done.
        self.held_calls: list[dict[str, Any]] = []

    def delta(self, delta: dict[str, Any], logprobs: dict[str, Any] | None) -> list[str]:
        out: list[str] = []
        if delta.get("reasoning"):
            out += self._open("reasoning")
            self.open["content"][0]["text"] += delta["reasoning"]
            out.append(self.events.emit("response.reasoning_text.delta", item_id=self.open["id"],
                                        output_index=len(self.items) - 1, content_index=0, delta=delta["reasoning"]))
        lps = _content_logprobs(logprobs) if self.with_logprobs else []
        if delta.get("content"):
            out += self._open("message")
        if self.open is not None and self.open["type"] == "message" and (delta.get("content") or lps):
            # Tokens without text of their own (the EOS that ends the answer) keep their
            # logprobs too, in a delta of no text.
            out.append(self._text_delta(delta.get("content") or "", lps))
        else:
            self.pending_logprobs += lps
        for call in delta.get("tool_calls") or []:
            # The open message still takes the logprobs of the call's tokens and of the
            # EOS after it (they are the unstreamed message's): the call waits for its end.
            if self.held_calls or (self.with_logprobs and self.open is not None and self.open["type"] == "message"):
                self.held_calls.append(call)
            else:
                out += self._call_delta(call)
        return out

    def _call_delta(self, call: dict[str, Any]) -> list[str]:
        """Open a chat tool call's ``function_call`` item, or add to its arguments."""
        out: list[str] = []
        function = call.get("function") or {}
        item = self.calls.get(call["index"])
        if item is None:
            out += self._close()
            item = {"type": "function_call", "id": _id("fc"), "call_id": call.get("id") or _id("call"),
                    "name": function.get("name") or "", "arguments": "", "status": "in_progress"}
            self.calls[call["index"]] = item
            self.items.append(item)
            self.open = item
            out.append(self.events.emit("response.output_item.added", output_index=len(self.items) - 1, item=item))
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            out.append(self.events.emit("response.function_call_arguments.delta", item_id=item["id"],
                                        output_index=self.items.index(item), delta=function["arguments"]))
        return out

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> str:
        """Add to the open message's text, with the logprobs held for it before these."""
        assert self.open is not None
        logprobs, self.pending_logprobs = self.pending_logprobs + logprobs, []
        part = self.open["content"][0]
        part["text"] += text
        if self.with_logprobs:
            part["logprobs"] += logprobs
        return self.events.emit("response.output_text.delta", item_id=self.open["id"],
                                output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=logprobs)

    def _open(self, kind: str) -> list[str]:
        if self.open is not None and self.open["type"] == kind:
            return []
        out = self._close()
        if kind == "reasoning":
            item = {"type": "reasoning", "id": _id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        else:
            item = {"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress",
                    "content": [_text_part("", [] if self.with_logprobs else None)]}
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        out.append(self.events.emit("response.output_item.added", output_index=index,
                                    item={**item, "content": []} if kind == "message" else item))
        if kind == "message":
            out.append(self.events.emit("response.content_part.added", item_id=item["id"], output_index=index,
                                        content_index=0, part=_text_part("", [] if self.with_logprobs else None)))
        return out

    def _close(self, status: str = "completed") -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        index = self.items.index(item)
        out = []
        if item["type"] == "reasoning":
            out.append(self.events.emit("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                        content_index=0, text=item["content"][0]["text"]))
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self.events.emit("response.output_text.done", item_id=item["id"], output_index=index,
                                        content_index=0, text=part["text"], logprobs=part.get("logprobs") or []))
            out.append(self.events.emit("response.content_part.done", item_id=item["id"], output_index=index,
                                        content_index=0, part=part))
        else:
            out.append(self.events.emit("response.function_call_arguments.done", item_id=item["id"],
                                        output_index=index, arguments=item["arguments"]))
        out.append(self.events.emit("response.output_item.done", output_index=index, item=item))
        return out

    def close(self, status: str = "completed") -> list[str]:
        """Close the open item, then stream the function calls held back behind it; an
        output with neither a message nor a function call (none at all, or reasoning alone)
        gets an empty message, as a response that is not streamed has. The last item gets
        ``status`` (``incomplete``: the output was cut there, as OpenAI marks it)."""
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            out = self._open("message")
            if self.pending_logprobs:
                out.append(self._text_delta("", []))
            return out + self._close(status)
        held, self.held_calls = self.held_calls, []
        out = self._close("completed" if held else status)
        for call in held:
            out += self._call_delta(call)
        return out + self._close(status)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's limits on ``metadata``: 16 pairs, keys of 64 and values of 512 characters."""
    if metadata is None:
        return
    if len(metadata) > 16:
        raise BadRequest(f"metadata has {len(metadata)} keys: at most 16", "metadata")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise BadRequest(f"metadata key {key[:64]!r}...: keys may have 64 characters and values 512", "metadata")


def _query_bool(query: dict[str, str], name: str) -> bool:
    """Take the boolean query parameter ``name`` out of ``query`` (absent: false).

    Raises:
        BadRequest: It is not a boolean.
    """
    value = query.pop(name, None)
    if value is None or value.lower() in ("false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise BadRequest(f"{name}={quoted(value)} is not a boolean: expected true or false", name)


#: The largest ``starting_after`` taken (18 digits: no event stream comes near it).
_MAX_SEQUENCE_NUMBER = 10**18 - 1


def _sequence_number(value: str) -> int:
    """``starting_after``: a sequence number, or -1 (the events from the first).

    Raises:
        BadRequest: It is not an integer of at least -1.
    """
    if re.fullmatch(r"-?[0-9]{1,18}", value) is None or int(value) < -1:
        raise BadRequest(f"starting_after={quoted(value)} is invalid: expected an integer from -1 to "
                         f"{_MAX_SEQUENCE_NUMBER}, the sequence number of the event after which the stream starts "
                         "(-1: from the first)", "starting_after")
    return int(value)


def _sse_data(raw: str) -> list[str]:
    """The ``data:`` payloads of one or more SSE events."""
    return [line[len("data: "):] for line in raw.split("\n") if line.startswith("data: ")]


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _content_logprobs(logprobs: Any) -> list[dict[str, Any]]:
    """Chat logprobs (a model or its dict) as an ``output_text`` part's ``logprobs``."""
    if logprobs is None:
        return []
    content = logprobs["content"] if isinstance(logprobs, dict) else [c.model_dump() for c in logprobs.content]
    return [{"token": c["token"], "logprob": c["logprob"], "bytes": c["bytes"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                              for t in c.get("top_logprobs") or []]} for c in content or []]


def _output_items(reasoning: str | None, content: str | None, calls: list[dict[str, str]],
                  logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reasoning:
        items.append({"type": "reasoning", "id": _id("rs"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}], "status": "completed"})
    if content or not calls:
        items.append({"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
                      "content": [_text_part(content or "", logprobs)]})
    for call in calls:
        items.append({"type": "function_call", "id": _id("fc"), "call_id": call["call_id"], "name": call["name"],
                      "arguments": call["arguments"], "status": "completed"})
    return items


def _assistant_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages a next turn's template reads."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        if item["type"] == "reasoning":
            message["reasoning"] = item["content"][0]["text"]
        elif item["type"] == "message":
            message["content"] += "".join(p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
    return [message]


def _input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as chat messages.

    Raises:
        BadRequest: An item of a kind forkless does not take, or a malformed one.
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item, for the assistant turn after it
    for i, item in enumerate(value):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"{where}.role {role!r} is invalid: expected user, system, developer or assistant",
                                 "input")
            message: dict[str, Any] = {"role": role, "content": _text_content(item.get("content"), f"{where}.content")}
            if role == "assistant" and reasoning is not None:
                message["reasoning"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            call = {"id": _required(item, "call_id", where), "type": "function",
                    "function": {"name": _required(item, "name", where), "arguments": _required(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and reasoning is None:
                # The calls of the assistant turn whose text (or first call) came just
                # before: one chat message, as a stored response's output becomes
                # (_assistant_messages), so output items sent back as input make the
                # same prompt as previous_response_id.
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning"], reasoning = reasoning, None
                messages.append(message)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": _required(item, "call_id", where),
                             "content": output if isinstance(output, str)
                             else _text_content(output, f"{where}.output")})
        elif kind == "reasoning":
            key = "content" if item.get("content") else "summary"
            reasoning = _text_content(item.get(key) or [], f"{where}.{key}", _REASONING_PARTS)
        else:
            # (As in vLLM, an item_reference is refused too: stored items are not looked up
            # by id; previous_response_id carries a stored conversation on.)
            hint = "; send the item itself, or chain with previous_response_id" if kind == "item_reference" else ""
            raise BadRequest(f"{where}.type {kind!r} is not supported (supported: message, function_call, "
                             f"function_call_output, reasoning{hint})", "input")
    if not messages:
        raise BadRequest("input has no messages", "input")
    return messages


def _required(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key} is missing or not a string", "input")
    return value


def _text_content(content: Any, where: str, kinds: tuple[str, ...] = _TEXT_PARTS) -> str:
    """A message's content (a string, or parts of the types ``kinds``) as one string.

    Args:
        content: The content.
        where: Its place in ``input``, for errors (``input[2].content``).
        kinds: The part types it may hold (a reasoning item's are its own).
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of text parts", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise BadRequest(f"{where}[{j}] of type {kind!r} is not supported: this server takes text "
                             f"({', '.join(kinds)})", "input")
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}[{j}].text must be a string", "input")
        texts.append(part["text"])
    return "".join(texts)


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise BadRequest(f"tools[{i}] of type {tool.get('type')!r} is not supported: only function tools",
                         "tools")
    if not isinstance(tool.get("name"), str):
        raise BadRequest(f"tools[{i}].name is missing", "tools")
    function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(f"tool_choice {choice!r} is not supported: give none, auto, required or "
                     '{"type": "function", "name": ...}', "tool_choice")


def _response_format(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, dict):
        raise BadRequest(f"text.format must be an object such as {{\"type\": \"json_schema\", ...}}, got "
                         f"{type(fmt).__name__}", "text")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        # Required, as OpenAI's and vLLM's: without it the chat request would constrain the
        # answer to any JSON object (a chat-style {"json_schema": {...}} here would do so).
        if not isinstance(fmt.get("schema"), dict):
            raise BadRequest('text.format of type "json_schema" needs a "schema" object (text.format is '
                             '{"type": "json_schema", "name": ..., "schema": {...}})', "text")
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest(f"text.format type {kind!r} is invalid: expected text, json_object or json_schema", "text")
