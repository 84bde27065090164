"""Turns one step's logits into sampled token ids (and logprobs when asked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from forkless import envs
from forkless.logits_processors.interface import LogitsProcessorError
from forkless.logits_processors.min_p import MinPLogitsProcessor
from forkless.sample.argmax import row_argmax
from forkless.sample.exponential import exponential_
from forkless.sample.logprobs import LogprobsTensors, gather_logprobs
from forkless.sample.penalties import apply_penalties
from forkless.sample.top_k_top_p import apply_top_k_top_p
from forkless.sampling_params import SAMPLING_EPS
from forkless.triton_utils import triton_available
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import LogitsProcessor
    from forkless.sample.metadata import SamplingMetadata

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
#: A seeded row's step seed as the race kernels take it (below 2**62: room for its rounds).
_ROW_SEED_MASK = (1 << 62) - 1


@dataclass
class SamplerOutput:
    """One step's result, row-aligned with the batch.

    Attributes:
        sampled_token_ids: ``[B]`` int64.
        logprobs: Present when any row asked for logprobs.
    """

    sampled_token_ids: torch.Tensor
    logprobs: LogprobsTensors | None


class Sampler:
    """Logits processors -> penalties -> greedy / random sampling, in vLLM's order.

    Order, per step:
      1. logits processors that are not argmax-invariant (min_tokens, logit_bias, ...);
      2. repetition, presence and frequency penalties;
      3. greedy rows take the argmax (ties: the lowest token id);
      4. random rows: temperature, the argmax-invariant processors (min_p, relative to
         the tempered distribution), top-k, top-p (vLLM's order), then an exponential
         race (``argmax(p / q)``, ``q ~ Exp(1)``), which draws exactly from ``p``. Seeded
         rows draw ``q`` from their own generator, so their tokens do not depend on the
         rest of the batch; the other rows share one vectorized draw.

    On CUDA a step whose rows need nothing but their temperature (the API's default
    sampling) runs steps 3 and 4 as one pass over the logits (``race_triton``), the same
    race without the float32 copy, the probabilities or the noise tensor; with top-k,
    top-p and min_p too (a model's ``generation_config.json`` often sets the first two),
    a few passes a row instead of a sort of the vocabulary. Other CUDA steps take the
    race kernels for step 4's top-k, top-p and race, after the PyTorch ops of the rest; a
    seeded row there draws its noise from its step's seed in the kernel (not from its
    generator, as on the CPU).

    Logprobs (``logprobs_mode``):
      * ``"raw_logprobs"`` (default, as vLLM's default): log-softmax of the model's logits
        before penalties, processors and temperature -- the model's own distribution.
      * ``"processed_logprobs"``: after penalties and logits processors, before
        temperature / top-k / top-p -- what the request's constraints made of it.

    Args:
        logprobs_mode: Which logits the returned logprobs describe.
    """

    def __init__(self, logprobs_mode: LogprobsMode = "raw_logprobs") -> None:
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(
                f"logprobs_mode={logprobs_mode!r} is invalid: expected 'raw_logprobs' or "
                "'processed_logprobs'"
            )
        self.logprobs_mode = logprobs_mode

    def __call__(self, logits: torch.Tensor, metadata: "SamplingMetadata") -> SamplerOutput:
        """Sample one token per row.

        Args:
            logits: ``[B, V]`` logits of the batch's rows in row order, in the model's
                dtype (cast to float32 unless every row is greedy and nothing changes
                them). Modified in place: do not reuse them afterwards.
            metadata: From ``InputBatch.refresh()`` for this step.

        Returns:
            The sampled ids and, when any row asked, their logprobs.
        """
        if not self.needs_float32(metadata):
            # Nothing moves a logit of a greedy row: the argmax in the model's dtype is the
            # float32 one (the cast is exact and keeps order and ties), without writing a
            # float32 copy of the logits (0.11 ms a step at 512 x 151,936 on an H200).
            return SamplerOutput(sampled_token_ids=row_argmax(logits), logprobs=None)
        if self.races_in_one_pass(logits, metadata):
            assert metadata.temperature is not None
            return SamplerOutput(sampled_token_ids=_race(logits, metadata.temperature, metadata,
                                                         min_p=_min_p_rows(metadata)), logprobs=None)
        logits = logits.to(torch.float32)
        want_logprobs = metadata.max_num_logprobs is not None
        raw = None
        if want_logprobs and self.logprobs_mode == "raw_logprobs":
            raw = torch.log_softmax(logits, dim=-1)

        invariant: list["LogitsProcessor"] = []
        for processor in metadata.logits_processors:
            if processor.is_argmax_invariant():
                invariant.append(processor)
            else:
                logits = _apply(processor, logits)
        if not metadata.no_penalties:
            assert metadata.output_token_ids is not None
            logits = apply_penalties(
                logits,
                metadata.prompt_token_ids,
                metadata.output_token_ids,
                metadata.presence_penalties,  # type: ignore[arg-type]
                metadata.frequency_penalties,  # type: ignore[arg-type]
                metadata.repetition_penalties,  # type: ignore[arg-type]
            )
        if want_logprobs and raw is None:
            raw = torch.log_softmax(logits, dim=-1)

        sampled = self._sample(logits, metadata, invariant)
        logprobs = None
        if raw is not None:
            assert metadata.max_num_logprobs is not None
            logprobs = gather_logprobs(raw, metadata.max_num_logprobs, sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    @staticmethod
    def needs_float32(metadata: "SamplingMetadata") -> bool:
        """Whether the step computes with its logits (a random row, penalties, logprobs, an
        active processor that may move an argmax) and so needs them in float32; else it
        takes each row's argmax of the logits as the model gave them."""
        return not (metadata.all_greedy and metadata.no_penalties and metadata.max_num_logprobs is None
                    and all(p.is_argmax_invariant() or not p.is_active() for p in metadata.logits_processors))

    @staticmethod
    def races_in_one_pass(logits: torch.Tensor, metadata: "SamplingMetadata") -> bool:
        """Whether the step's rows go to the race kernels (``race_triton``): CUDA logits
        (Triton installed), some random row, and nothing but temperature, top-k, top-p
        and min_p (the built-in processor, whose rows the kernel takes) to apply -- no
        penalties, logprobs, other active logits processor or seeded row. (A seeded
        row's step always takes the general path, whose kernel call draws from its own
        seed: its arithmetic then never depends on what its neighbours need, as the
        in-kernel temperature of this path would make it.)"""
        return (not metadata.all_greedy and metadata.temperature is not None and metadata.no_penalties
                and metadata.max_num_logprobs is None and not metadata.generators
                and all(isinstance(p, MinPLogitsProcessor) or not p.is_active() for p in metadata.logits_processors)
                and Sampler._races_on(logits))

    @staticmethod
    def _races_on(logits: torch.Tensor) -> bool:
        """Whether the race kernels take these logits: on CUDA with Triton (and
        ``FORKLESS_CUDA_SAMPLER`` on), one row each."""
        if logits.device.type != "cuda" or not triton_available() or not envs.FORKLESS_CUDA_SAMPLER:
            return False
        from forkless.sample.race_triton import MAX_ENTRIES

        return logits.dim() == 2 and logits.stride(1) == 1 and logits.numel() <= MAX_ENTRIES

    def _sample(
        self,
        logits: torch.Tensor,
        metadata: "SamplingMetadata",
        invariant: list["LogitsProcessor"],
    ) -> torch.Tensor:
        greedy = None
        if not metadata.all_random:
            greedy = row_argmax(logits)
            if metadata.all_greedy:
                return greedy
        assert metadata.temperature is not None
        is_greedy = metadata.temperature < SAMPLING_EPS
        temperature = metadata.temperature
        if greedy is not None:
            # Greedy rows' results are already taken; 1.0 keeps their arithmetic finite.
            temperature = torch.where(is_greedy, 1.0, temperature)
        logits = logits.div_(temperature.unsqueeze(1))
        for processor in invariant:
            logits = _apply(processor, logits)
        if self._races_on(logits):
            # The tempered, processed logits race at temperature 1, with top-k and top-p
            # in the kernel rather than a sort; greedy rows' draws are replaced below.
            row_seeds = None
            if metadata.generators:
                # Seeded rows draw from their step's seed (seeding.step_seed, which their
                # generators hold) in the one kernel, whatever the other rows need.
                seeds = [-1] * logits.shape[0]
                for row, generator in metadata.generators.items():
                    seeds[row] = generator.initial_seed() & _ROW_SEED_MASK
                row_seeds = async_tensor_h2d(seeds, torch.int64, logits.device, logits.is_cuda)
            sampled = _race(logits, torch.ones_like(temperature), metadata, row_seeds)
        else:
            logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
            sampled = self._exponential_race(logits.softmax(dim=-1), metadata.generators)
        return sampled if greedy is None else torch.where(is_greedy, greedy, sampled)

    @staticmethod
    def _exponential_race(
        probs: torch.Tensor, generators: "dict[int, torch.Generator]"
    ) -> torch.Tensor:
        q = torch.empty_like(probs)
        if len(generators) < probs.shape[0]:
            exponential_(q)
        for row, generator in generators.items():
            exponential_(q[row], generator)
        return row_argmax(probs.div_(q))


def _race(logits: torch.Tensor, temperature: torch.Tensor, metadata: "SamplingMetadata",
          row_seeds: torch.Tensor | None = None, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """The rows' tokens from the race kernels: the one-pass race where no row has a top-k,
    a top-p, a min_p or its own seed, else the kernel that takes them (the same for every
    batch with a seeded row, so that its draws do not depend on its neighbours)."""
    from forkless.sample.race_triton import race_rows, race_rows_top_k_top_p

    if row_seeds is None and metadata.top_k is None and metadata.top_p is None and min_p is None:
        return race_rows(logits, temperature)
    return race_rows_top_k_top_p(logits, temperature, metadata.top_k, metadata.top_p, row_seeds=row_seeds,
                                 min_p=min_p)


def _min_p_rows(metadata: "SamplingMetadata") -> torch.Tensor | None:
    """The rows' ``min_p`` where the built-in processor is active (the race kernels apply
    it in place of its PyTorch ops), else ``None``."""
    for processor in metadata.logits_processors:
        if isinstance(processor, MinPLogitsProcessor) and processor.is_active():
            return processor.row_min_p()
    return None


def _apply(processor: "LogitsProcessor", logits: torch.Tensor) -> torch.Tensor:
    """``processor.apply(logits)``, checked: what it raises, or a result that is not a float
    tensor of the logits' shape, fails the step naming the processor (the sampler would
    otherwise fail far from it, or sample from the wrong ids)."""
    try:
        result = processor.apply(logits)
    except Exception as e:
        raise LogitsProcessorError.wrap(processor, "apply", e) from e
    if not isinstance(result, torch.Tensor):
        got = "None" if result is None else f"a {type(result).__name__}"
    elif result.shape != logits.shape or not result.is_floating_point():
        got = f"a {result.dtype} tensor of shape {list(result.shape)}"
    else:
        return result
    raise LogitsProcessorError.bad_result(processor, "apply", got,
                                          f"a float tensor of the input's shape {list(logits.shape)}")
