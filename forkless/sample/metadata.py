"""The per-step tensors and flags the ``Sampler`` consumes (built by ``InputBatch``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from forkless.logits_processors.interface import LogitsProcessor


@dataclass
class SamplingMetadata:
    """Everything the sampler needs about the rows of one step, in row order.

    Optional tensors are ``None`` when no row uses the feature, so the sampler skips it.

    Attributes:
        temperature: ``[B]`` float32; values below ``SAMPLING_EPS`` mark greedy rows.
            ``None`` when every row is greedy.
        all_greedy: Every row is greedy.
        all_random: No row is greedy.
        top_p: ``[B]`` float32 (1.0 = off), or ``None``.
        top_k: ``[B]`` int64 (vocab size = off), or ``None``.
        generators: Row -> generator of seeded rows, already seeded for this step.
        max_num_logprobs: Largest ``SamplingParams.logprobs`` of the batch, or ``None``.
        num_logprobs: Per row, its ``SamplingParams.logprobs``.
        no_penalties: No row uses presence / frequency / repetition penalties.
        presence_penalties: ``[B]`` float32, or ``None`` when ``no_penalties``.
        frequency_penalties: ``[B]`` float32, or ``None`` when ``no_penalties``.
        repetition_penalties: ``[B]`` float32, or ``None`` when ``no_penalties``.
        prompt_token_ids: ``[B, P]`` int64 padded with the vocab size, or ``None``.
        output_token_ids: ``[B, O]`` int64 padded with the vocab size, or ``None``.
        logits_processors: The processors, already updated for this step.
    """

    temperature: "torch.Tensor | None"
    all_greedy: bool
    all_random: bool
    top_p: "torch.Tensor | None"
    top_k: "torch.Tensor | None"
    generators: "dict[int, torch.Generator]"
    max_num_logprobs: int | None
    num_logprobs: list[int | None]
    no_penalties: bool
    presence_penalties: "torch.Tensor | None" = None
    frequency_penalties: "torch.Tensor | None" = None
    repetition_penalties: "torch.Tensor | None" = None
    prompt_token_ids: "torch.Tensor | None" = None
    output_token_ids: "torch.Tensor | None" = None
    logits_processors: "list[LogitsProcessor]" = field(default_factory=list)
