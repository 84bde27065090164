"""Beam search over the engine, as vLLM's ``LLM.beam_search`` does it: one engine step per
generated position, every live beam a one-token request.

Invariants:
    * Each step asks the engine for one token per live beam with ``2 * beam_width``
      logprobs: every token in that dict (the top ``2 * beam_width`` and the sampled one)
      is a candidate continuation, scored by the beam's cumulative logprob plus its own.
    * A candidate ending in EOS (unless ``ignore_eos``) is complete and leaves the search
      (only the best ``beam_width`` complete ones are kept: their scores are final); the
      others are ranked by :func:`get_beam_search_score` and the best ``beam_width`` live
      on. A beam that reaches ``max_model_len`` is complete too (``length``).
    * The answer is the best ``beam_width`` of the complete and live beams together,
      best first. ``tokens`` include the prompt (vLLM's convention), and so does ``text``
      offline (``LLM.beam_search``, vLLM's: the decoded tokens), while the API server's
      completions take the generated part alone (:meth:`BeamSearch.results`'
      ``with_prompt``); either way the EOS token's text is left out unless
      ``include_stop_str_in_output``.
    * Beams of one prompt share their prefix, so the prefix cache makes a step's prefills
      short: only the tokens past the last full cached block are computed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from forkless.outputs import Logprob
from forkless.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, logprobs_cap

__all__ = ["BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence", "get_beam_search_score", "BeamSearch"]

if TYPE_CHECKING:
    from forkless.outputs import RequestOutput
    from forkless.protocol.lora import LoRARequest


@dataclass
class BeamSearchSequence:
    """One beam: its tokens (prompt included), the logprobs of each generated position,
    and its cumulative logprob; ``text`` (see :meth:`BeamSearch.results`) and
    ``finish_reason`` are set when returned."""

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


class BeamSearch:
    """The search over a set of prompts, driven one step at a time by the caller's engine
    (``LLM.beam_search`` steps it synchronously, ``AsyncLLM.beam_search`` with awaits).

    Args:
        prompts: The prompts' token ids.
        params: The search's parameters.
        eos_token_id: The token that completes a beam (unless ``ignore_eos``).
        model_config: The engine's ``ModelConfig``: a beam ``max_model_len`` long is
            complete, and ``2 * beam_width`` must be within ``max_logprobs``.
        lora_requests: One adapter (or ``None``) per prompt.

    Raises:
        ValueError: ``2 * beam_width`` logprobs a step are over ``max_logprobs``.
    """

    def __init__(self, prompts: Sequence[list[int]], params: BeamSearchParams, eos_token_id: int | None,
                 model_config: Any, lora_requests: Sequence[LoRARequest | None]) -> None:
        cap = logprobs_cap(model_config.max_logprobs, model_config.vocab_size)
        if 2 * params.beam_width > cap:
            raise ValueError(f"beam_width={params.beam_width} needs {2 * params.beam_width} logprobs a step, "
                             f"over max_logprobs ({cap}): use beam_width <= {cap // 2}, or raise "
                             "max_logprobs (--max-logprobs)")
        self.params = params
        self.eos = None if params.ignore_eos else eos_token_id
        self.max_model_len = model_config.max_model_len
        self.instances = [BeamSearchInstance(len(ids), [BeamSearchSequence(list(ids), lora_request=lora)])
                          for ids, lora in zip(prompts, lora_requests)]
        self.steps_left = params.max_tokens
        #: What each step's requests sample with: one token, 2 * beam_width logprobs.
        self.step_params = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width,
                                          temperature=params.temperature, detokenize=False, ignore_eos=True,
                                          output_kind=RequestOutputKind.FINAL_ONLY)
        self._live: list[tuple[BeamSearchInstance, BeamSearchSequence]] = []

    def requests(self) -> list[tuple[dict[str, Any], LoRARequest | None]]:
        """This step's one-token requests (a token prompt and its adapter per live beam);
        empty once the search is over."""
        self._live = [(inst, beam) for inst in self.instances for beam in inst.beams] if self.steps_left else []
        return [({"prompt_token_ids": beam.tokens}, beam.lora_request) for _, beam in self._live]

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        """Extend the beams with the outputs of :meth:`requests`' requests, in order."""
        self.steps_left -= 1
        candidates: dict[int, list[BeamSearchSequence]] = {id(inst): [] for inst in self.instances}
        for (inst, beam), out in zip(self._live, outputs, strict=True):
            top = out.outputs[0].logprobs[0]
            for token, lp in top.items():
                child = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [top], beam.lora_request,
                                           beam.cum_logprob + lp.logprob)
                if token == self.eos:
                    child.finish_reason = "stop"
                    inst.completed.append(child)
                else:
                    candidates[id(inst)].append(child)
        for inst in self.instances:
            ranked = sorted(candidates[id(inst)], key=self._score, reverse=True)[:self.params.beam_width]
            inst.beams = []
            for beam in ranked:
                if len(beam.tokens) >= self.max_model_len:  # no room for another token
                    beam.finish_reason = "length"
                    inst.completed.append(beam)
                else:
                    inst.beams.append(beam)
            # A complete beam's score is final: only the best beam_width can be in the answer.
            inst.completed = sorted(inst.completed, key=self._score, reverse=True)[:self.params.beam_width]

    def results(self, tokenizer: Any, with_prompt: bool = False) -> list[BeamSearchOutput]:
        """Each prompt's best ``beam_width`` sequences, best first, their ``text`` decoded.

        Args:
            tokenizer: Decodes ``text``.
            with_prompt: Decode the prompt's tokens too, as vLLM's ``LLM.beam_search`` does
                (one decode of the whole sequence); otherwise ``text`` is the generated
                part, as a completion's.
        """
        outputs = []
        for inst in self.instances:
            for beam in inst.beams:
                beam.finish_reason = "length"
            best = sorted(inst.completed + inst.beams, key=self._score, reverse=True)[:self.params.beam_width]
            for beam in best:
                shown = beam.tokens if with_prompt else beam.tokens[inst.prompt_len:]
                if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                    shown = shown[:-1]
                beam.text = tokenizer.decode(shown, skip_special_tokens=self.params.skip_special_tokens)
            outputs.append(BeamSearchOutput(best))
        return outputs

    def _score(self, beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, self.eos, self.params.length_penalty)
