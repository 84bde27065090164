"""Beam search over the engine, as vLLM's ``LLM.beam_search`` does it: one engine step per
generated position, every live beam a one-token request.

Invariants:
    * Each step asks the engine for one token per live beam with ``2 * beam_width``
      logprobs: every token in that dict (the top ``2 * beam_width`` and the sampled one)
      is a candidate continuation, scored by the beam's cumulative logprob plus its own.
    * A candidate ending in EOS (unless ``ignore_eos``) is complete and leaves the search;
      the others are ranked by :func:`get_beam_search_score` and the best ``beam_width``
      live on. A beam that reaches ``max_model_len`` is complete too (``length``).
    * The answer is the best ``beam_width`` of the complete and live beams together,
      best first. ``tokens`` include the prompt (vLLM's convention); ``text`` is the
      generated part only, the EOS token's text left out unless
      ``include_stop_str_in_output``.
    * Beams of one prompt share their prefix, so the prefix cache makes a step's prefills
      short: only the tokens past the last full cached block are computed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from forkless.outputs import Logprob
from forkless.sampling_params import BeamSearchParams, SamplingParams

__all__ = ["BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence", "get_beam_search_score", "run_beam_search"]

if TYPE_CHECKING:
    from forkless.outputs import RequestOutput
    from forkless.protocol.lora import LoRARequest


@dataclass
class BeamSearchSequence:
    """One beam: its tokens (prompt included), the logprobs of each generated position,
    and its cumulative logprob; ``text`` and ``finish_reason`` are set when returned."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    lora_request: LoRARequest | None = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


@dataclass
class BeamSearchInstance:
    """One prompt's search: the live beams and those complete."""

    prompt_len: int
    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = field(default_factory=list)


def get_beam_search_score(tokens: list[int], cumulative_logprob: float, eos_token_id: int | None,
                          length_penalty: float = 1.0) -> float:
    """The beam's rank: cumulative logprob over its length (prompt included, a final EOS
    not) to the power ``length_penalty``."""
    length = len(tokens) - (1 if eos_token_id is not None and tokens[-1] == eos_token_id else 0)
    return cumulative_logprob / (max(length, 1) ** length_penalty)


def run_beam_search(
    generate: Callable[[list[dict[str, Any]], SamplingParams, list[Any]], list[RequestOutput]],
    tokenizer: Any,
    prompts: Sequence[list[int]],
    params: BeamSearchParams,
    eos_token_id: int | None,
    max_model_len: int,
    lora_requests: Sequence[LoRARequest | None],
) -> list[BeamSearchOutput]:
    """Search every prompt's beams together, one engine call per generated position.

    Args:
        generate: Runs one-token requests (token prompts, their params, their adapters)
            to completion and returns their outputs in order.
        tokenizer: Turns the generated tokens into ``text``.
        prompts: The prompts' token ids.
        params: The search's parameters.
        eos_token_id: The token that completes a beam (unless ``ignore_eos``).
        max_model_len: A beam this long is complete.
        lora_requests: One adapter (or ``None``) per prompt.

    Returns:
        One output per prompt, in order.
    """
    step = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature,
                          detokenize=False, ignore_eos=True)
    eos = None if params.ignore_eos else eos_token_id
    instances = [BeamSearchInstance(len(ids), [BeamSearchSequence(list(ids), lora_request=lora)])
                 for ids, lora in zip(prompts, lora_requests)]

    def score(beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, eos, params.length_penalty)

    for _ in range(params.max_tokens):
        live = [(inst, beam) for inst in instances for beam in inst.beams]
        if not live:
            break
        outputs = generate([{"prompt_token_ids": beam.tokens} for _, beam in live], step,
                           [beam.lora_request for _, beam in live])
        candidates: dict[int, list[BeamSearchSequence]] = {id(inst): [] for inst in instances}
        for (inst, beam), out in zip(live, outputs):
            top = out.outputs[0].logprobs[0]
            for token, lp in top.items():
                child = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [top], beam.lora_request,
                                           beam.cum_logprob + lp.logprob)
                if token == eos:
                    child.finish_reason, child.stop_reason = "stop", None
                    inst.completed.append(child)
                else:
                    candidates[id(inst)].append(child)
        for inst in instances:
            ranked = sorted(candidates[id(inst)], key=score, reverse=True)[:params.beam_width]
            inst.beams = []
            for beam in ranked:
                if len(beam.tokens) >= max_model_len:  # no room for another token
                    beam.finish_reason = "length"
                    inst.completed.append(beam)
                else:
                    inst.beams.append(beam)
    results = []
    for inst in instances:
        for beam in inst.beams:
            beam.finish_reason = "length"
        best = sorted(inst.completed + inst.beams, key=score, reverse=True)[:params.beam_width]
        for beam in best:
            generated = beam.tokens[inst.prompt_len:]
            if beam.finish_reason == "stop" and not params.include_stop_str_in_output:
                generated = generated[:-1]
            beam.text = tokenizer.decode(generated, skip_special_tokens=True)
        results.append(BeamSearchOutput(best))
    return results
