"""``LLM.beam_search`` (vLLM's API): the beams it returns against an exhaustive search with
transformers' logits, greedy at width 1, EOS handling, and its errors."""

from __future__ import annotations

import pytest
import torch

from forkless import LLM, SamplingParams
from forkless.beam_search import BeamSearchOutput, get_beam_search_score
from forkless.sampling_params import BeamSearchParams

PROMPTS = ["The quick brown fox", "Paris is the capital of"]


@pytest.fixture(scope="module")
def llm(llama_dir) -> LLM:
    return LLM(str(llama_dir), dtype="float32", kv_cache_memory=1 << 23, block_size=4)


def _logprobs(hf_llama, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(hf_llama(torch.tensor([ids])).logits[0, -1].float(), dim=-1)


def test_two_steps_match_the_search_over_transformers_logits(llm: LLM, hf_llama) -> None:
    # Width W over two positions: the W best first tokens, each with its 2W best second
    # tokens; every beam has the same length, so the scores order by cumulative logprob.
    width = 3
    params = BeamSearchParams(beam_width=width, max_tokens=2, ignore_eos=True)
    outputs = llm.beam_search(PROMPTS, params)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outputs):
        ids = tok.encode(prompt)
        first = _logprobs(hf_llama, ids)
        expected = []
        for t1 in first.topk(2 * width).indices.tolist():
            second = _logprobs(hf_llama, ids + [t1])
            for t2 in second.topk(2 * width).indices.tolist():
                expected.append((first[t1].item() + second[t2].item(), [t1, t2]))
        # The search keeps only the best `width` after the first step.
        kept = {t for t in sorted(first.topk(2 * width).indices.tolist(), key=lambda t: -first[t].item())[:width]}
        expected = sorted((e for e in expected if e[1][0] in kept), reverse=True)[:width]
        assert isinstance(out, BeamSearchOutput) and len(out.sequences) == width
        for seq, (cum, gen) in zip(out.sequences, expected):
            assert seq.tokens == ids + gen
            assert seq.cum_logprob == pytest.approx(cum, abs=1e-4)
            assert len(seq.logprobs) == 2 and seq.finish_reason == "length"
            assert seq.text == tok.decode(ids + gen, skip_special_tokens=True)  # with the prompt, as vLLM


def test_width_one_is_greedy(llm: LLM) -> None:
    beams = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    for b, g in zip(beams, greedy):
        assert b.sequences[0].tokens[len(g.prompt_token_ids):] == list(g.outputs[0].token_ids)


def test_sequences_come_best_first_and_stop_at_eos(llm: LLM) -> None:
    # The tiny random model rarely ends on its own: make EOS one of the candidates by
    # calling it EOS (the search ends a beam at the model's eos_token_id).
    engine_eos = llm.llm_engine.config.model_config.eos_token_id
    params = BeamSearchParams(beam_width=4, max_tokens=5, length_penalty=0.5)
    out = llm.beam_search([{"prompt_token_ids": [5, 6, 7]}], params, concurrency_limit=1)[0]
    scores = [get_beam_search_score(s.tokens, s.cum_logprob, engine_eos, 0.5) for s in out.sequences]
    assert scores == sorted(scores, reverse=True) and len(out.sequences) == 4
    for s in out.sequences:
        total = sum(lp[t].logprob for lp, t in zip(s.logprobs, s.tokens[3:]))
        assert s.cum_logprob == pytest.approx(total, abs=1e-5)
        assert (s.finish_reason == "stop") == (s.tokens[-1] == engine_eos)
        assert s.finish_reason == "stop" or len(s.tokens) == 3 + 5


def test_eos_ends_a_beam_and_leaves_the_text(llama_dir) -> None:
    # An engine whose EOS is the token the greedy path takes second: that beam stops there.
    probe = LLM(str(llama_dir), dtype="float32", kv_cache_memory=1 << 22)
    greedy = probe.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=2,
                                                                            ignore_eos=True), use_tqdm=False)
    second = greedy[0].outputs[0].token_ids[1]
    probe.llm_engine.config.model_config.eos_token_id = second
    out = probe.beam_search([{"prompt_token_ids": [5, 6, 7]}], BeamSearchParams(beam_width=1, max_tokens=4))[0]
    seq = out.sequences[0]
    assert seq.tokens[-1] == second and len(seq.tokens) == 5 and seq.finish_reason == "stop"
    tok = probe.get_tokenizer()
    assert seq.text == tok.decode(seq.tokens[:4])  # the prompt's and the output's, the EOS token's left out
    kept = probe.beam_search([{"prompt_token_ids": [5, 6, 7]}],
                             BeamSearchParams(beam_width=1, max_tokens=4, include_stop_str_in_output=True))[0]
    assert kept.sequences[0].text == tok.decode(seq.tokens)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"beam_width": 0, "max_tokens": 2}, "beam_width=0"),
    ({"beam_width": 2, "max_tokens": 0}, "max_tokens=0"),
    ({"beam_width": 2, "max_tokens": 2, "temperature": -1.0}, "temperature=-1.0"),
    ({"beam_width": 2, "max_tokens": 2, "length_penalty": float("nan")}, "length_penalty=nan"),
])
def test_bad_params_name_the_field(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        BeamSearchParams(**kwargs)


def test_a_width_over_max_logprobs_is_refused(llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"beam_width=11 needs 22 logprobs a step.*--max-logprobs"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="prompt"):
        llm.beam_search([{"text": "wrong key"}], BeamSearchParams(beam_width=2, max_tokens=2))
    assert not llm.llm_engine.has_unfinished_requests()
