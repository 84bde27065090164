"""The persistent batch: one row per running request, kept across steps (vLLM v1 style).

The model runner keeps one ``InputBatch`` for the life of the worker. Each step it removes
finished / unscheduled requests, adds new / resumed ones, calls ``refresh()`` to get the
``SamplingMetadata`` (this condenses holes and brings the logits processors up to date),
runs the model on ``req_ids`` in row order, samples, and appends the sampled tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from forkless.logits_processors.interface import LogitsProcessorError, MoveDirectionality
from forkless.sample.batch_update_builder import BatchUpdateBuilder
from forkless.sample.metadata import SamplingMetadata
from forkless.sample.seeding import make_generator, step_seed
from forkless.sampling_params import SamplingType
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate, LogitsProcessor
    from forkless.sampling_params import SamplingParams


@dataclass
class _Row:
    req_id: str
    params: "SamplingParams"
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None


@dataclass
class _Static:
    """Tensors that only change when the set or order of rows changes."""

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None
    top_k: torch.Tensor | None
    num_logprobs: list[int | None]
    max_num_logprobs: int | None
    no_penalties: bool
    presence: torch.Tensor | None
    frequency: torch.Tensor | None
    repetition: torch.Tensor | None
    prompt_token_ids: torch.Tensor | None


class InputBatch:
    """Rows of running requests plus the sampling state derived from them.

    Args:
        max_num_reqs: Most rows the batch may hold.
        vocab_size: The logits' last dimension (also the padding id of token tensors).
        device: Where the sampler's tensors go (the logits' device).
        pin_memory: Stage host -> device copies through pinned memory.
        logits_processors: The worker's processors (``build_logits_processors``); the
            batch feeds them a ``BatchUpdate`` on every ``refresh()``.
    """

    def __init__(
        self,
        max_num_reqs: int,
        vocab_size: int,
        device: torch.device | str = "cpu",
        pin_memory: bool = False,
        logits_processors: Sequence["LogitsProcessor"] = (),
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.pin_memory = pin_memory
        self.logits_processors = list(logits_processors)
        self.req_id_to_index: dict[str, int] = {}
        self._rows: list[_Row | None] = []
        self._builder = BatchUpdateBuilder()
        self._static: _Static | None = None

    # -- rows ---------------------------------------------------------------------------
    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    @property
    def req_ids(self) -> list[str | None]:
        """Request ids in row order (``None`` marks a hole until the next condense)."""
        return [row.req_id if row is not None else None for row in self._rows]

    def add_request(
        self,
        req_id: str,
        params: "SamplingParams",
        prompt_token_ids: list[int],
        output_token_ids: list[int] | None = None,
    ) -> int:
        """Put a request in the batch (a new one, or a resumed one with its outputs).

        Args:
            req_id: The request id; must not already be in the batch.
            params: Its sampling parameters.
            prompt_token_ids: Its prompt.
            output_token_ids: Tokens it already generated. The batch keeps this very list
                and ``append_output_token`` appends to it; processors hold it too.

        Returns:
            The row it occupies (a freed row is reused first).

        Raises:
            ValueError: The id is already present, or the batch is full.
        """
        if req_id in self.req_id_to_index:
            raise ValueError(f"request {req_id!r} is already in the batch")
        if self.num_reqs >= self.max_num_reqs:
            raise ValueError(f"the batch is full ({self.max_num_reqs} requests)")
        outputs = output_token_ids if output_token_ids is not None else []
        generator = None
        if params.sampling_type is SamplingType.RANDOM_SEED:
            generator = make_generator(self.device)
        row = _Row(req_id, params, list(prompt_token_ids), outputs, generator)
        index = self._first_hole()
        if index is None:
            index = len(self._rows)
            self._rows.append(row)
        else:
            self._rows[index] = row
            self._builder.discard_removed(index)
        self.req_id_to_index[req_id] = index
        self._builder.added_append((index, params, row.prompt_token_ids, outputs))
        self._static = None
        return index

    def remove_request(self, req_id: str) -> int | None:
        """Take a request out, leaving a hole that the next add or condense fills.

        Returns:
            The row it occupied, or ``None`` when it was not in the batch.
        """
        index = self.req_id_to_index.pop(req_id, None)
        if index is None:
            return None
        self._rows[index] = None
        self._builder.removed_append(index)
        self._static = None
        return index

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange two occupied rows (e.g. to put decodes before prefills)."""
        if a == b:
            return
        row_a, row_b = self._rows[a], self._rows[b]
        if row_a is None or row_b is None:
            raise ValueError(f"cannot swap rows {a} and {b}: both must hold a request")
        self._rows[a], self._rows[b] = row_b, row_a
        self.req_id_to_index[row_a.req_id] = b
        self.req_id_to_index[row_b.req_id] = a
        self._builder.moved_append(a, b, MoveDirectionality.SWAP)
        self._static = None

    def condense(self) -> None:
        """Fill holes by moving the last rows into them, so rows are ``0..num_reqs-1``."""
        holes = [i for i, row in enumerate(self._rows) if row is None]
        for hole in holes:
            while self._rows and self._rows[-1] is None:
                self._rows.pop()
            if hole >= len(self._rows):
                break
            last = len(self._rows) - 1
            row = self._rows.pop()
            assert row is not None
            self._rows[hole] = row
            self.req_id_to_index[row.req_id] = hole
            self._builder.moved_append(last, hole, MoveDirectionality.UNIDIRECTIONAL)
            self._static = None
        while self._rows and self._rows[-1] is None:
            self._rows.pop()

    def _first_hole(self) -> int | None:
        for index, row in enumerate(self._rows):
            if row is None:
                return index
        return None

    # -- tokens -------------------------------------------------------------------------
    def append_output_token(self, req_id: str, token_id: int) -> None:
        """Record a request's newly sampled token (processors see it at once)."""
        row = self._rows[self.req_id_to_index[req_id]]
        assert row is not None
        row.output_token_ids.append(int(token_id))

    def append_output_tokens(self, token_ids: Sequence[int | None]) -> None:
        """Record one step's samples in row order; ``None`` skips a row whose sample is
        discarded (a prefill chunk that did not reach the end of the prompt)."""
        for row, token in zip(self._rows, token_ids):
            if row is not None and token is not None:
                row.output_token_ids.append(int(token))

    def output_token_ids(self, req_id: str) -> list[int]:
        """The live list of a request's generated tokens."""
        row = self._rows[self.req_id_to_index[req_id]]
        assert row is not None
        return row.output_token_ids

    # -- per step -----------------------------------------------------------------------
    def pop_batch_update(self) -> "BatchUpdate | None":
        """Condense, then return what changed since the last call (``None``: nothing)."""
        self.condense()
        return self._builder.get_and_reset(self.num_reqs)

    def refresh(self) -> SamplingMetadata:
        """Prepare this step's sampling: condense, update processors, build tensors.

        Call once per step, after this step's adds and removes and before the forward
        pass (rows may move, so read ``req_ids`` afterwards).

        Returns:
            The metadata for ``Sampler.__call__``.
        """
        update = self.pop_batch_update()
        for processor in self.logits_processors:
            try:
                processor.update_state(update)
            except Exception as e:
                raise LogitsProcessorError.wrap(processor, "update_state", e) from e
        if self._static is None:
            self._static = self._build_static()
        static = self._static
        generators: dict[int, torch.Generator] = {}
        for index, row in enumerate(self._rows):
            if row is not None and row.generator is not None:
                seed = row.params.seed
                assert seed is not None
                row.generator.manual_seed(step_seed(seed, len(row.output_token_ids)))
                generators[index] = row.generator
        output_ids = None
        if not static.no_penalties:
            output_ids = self._padded([r.output_token_ids for r in self._live_rows()])
        return SamplingMetadata(
            temperature=static.temperature,
            all_greedy=static.all_greedy,
            all_random=static.all_random,
            top_p=static.top_p,
            top_k=static.top_k,
            generators=generators,
            max_num_logprobs=static.max_num_logprobs,
            num_logprobs=static.num_logprobs,
            no_penalties=static.no_penalties,
            presence_penalties=static.presence,
            frequency_penalties=static.frequency,
            repetition_penalties=static.repetition,
            prompt_token_ids=static.prompt_token_ids,
            output_token_ids=output_ids,
            logits_processors=self.logits_processors,
        )

    # -- tensor building ----------------------------------------------------------------
    def _live_rows(self) -> list[_Row]:
        rows = [row for row in self._rows if row is not None]
        if len(rows) != len(self._rows):
            raise RuntimeError("the batch has holes; call condense() first")
        return rows

    def _tensor(self, values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        return async_tensor_h2d(values, dtype, self.device, self.pin_memory)

    def _padded(self, seqs: list[list[int]]) -> torch.Tensor:
        width = max((len(s) for s in seqs), default=0)
        pad = self.vocab_size
        return self._tensor([s + [pad] * (width - len(s)) for s in seqs], torch.long)

    def _build_static(self) -> _Static:
        rows = self._live_rows()
        params = [row.params for row in rows]
        types = [p.sampling_type for p in params]
        all_greedy = all(t is SamplingType.GREEDY for t in types)
        all_random = not any(t is SamplingType.GREEDY for t in types)
        random_params = [p for p in params if p.sampling_type is not SamplingType.GREEDY]
        use_top_p = any(p.top_p < 1.0 for p in random_params)
        use_top_k = any(0 < p.top_k < self.vocab_size for p in random_params)
        num_logprobs = [p.logprobs for p in params]
        asked = [n for n in num_logprobs if n is not None]
        use_repetition = any(p.repetition_penalty != 1.0 for p in params)
        no_penalties = not use_repetition and not any(
            p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params
        )
        f32 = torch.float32
        return _Static(
            temperature=None if all_greedy else self._tensor([p.temperature for p in params], f32),
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=self._tensor([p.top_p for p in params], f32) if use_top_p else None,
            top_k=self._tensor(
                [p.top_k if 0 < p.top_k < self.vocab_size else self.vocab_size for p in params],
                torch.long,
            ) if use_top_k else None,
            num_logprobs=num_logprobs,
            max_num_logprobs=max(asked) if asked else None,
            no_penalties=no_penalties,
            presence=None if no_penalties else self._tensor([p.presence_penalty for p in params], f32),
            frequency=None if no_penalties else self._tensor([p.frequency_penalty for p in params], f32),
            repetition=None if no_penalties else self._tensor([p.repetition_penalty for p in params], f32),
            prompt_token_ids=self._padded([r.prompt_token_ids for r in rows]) if use_repetition else None,
        )
