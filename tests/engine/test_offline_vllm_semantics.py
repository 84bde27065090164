"""The offline API where vLLM 0.32 decides what a call means: each case was run on vLLM's
own ``LLM`` with the same model (SmolLM2-135M-Instruct) and gave what is asserted here.

Stop strings that complete in the same step, beam search's text, ``priority``, the
``SamplingParams`` normalisations and refusals (greedy ``n > 1``, ``temperature`` over 2,
``seed=-1``...), ``from_optional``, and vLLM's attribute and import names.
"""

from __future__ import annotations

import msgspec
import pytest

from forkless import LLM, RequestOutputKind, SamplingParams
from forkless.entrypoints.openai.errors import BadRequest
from forkless.entrypoints.openai.serving import to_sampling_params
from forkless.outputs import Logprob
from forkless.protocol.openai import ChatCompletionRequest, CompletionRequest
from forkless.sampling_params import BeamSearchParams, SamplingType, StructuredOutputsParams

P = "The capital of France is"  # greedy: " Paris.\n\nThe answer is:"
CHAT = [{"role": "user", "content": "Hi"}]
MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def llm():
    engine = LLM(max_model_len=MAX_MODEL_LEN)
    yield engine
    engine.shutdown()


def _greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=8, **kwargs)


# -- stop strings ----------------------------------------------------------------------------

@pytest.mark.parametrize(("stop", "include", "text", "reason"), [
    # " Paris" is one token: "ri" ends before "aris" does, so it wins wherever it is listed.
    (["aris", "ri"], False, " Pa", "ri"),
    (["ri", "aris"], False, " Pa", "ri"),
    (["aris", "ri"], True, " Pari", "ri"),
    (["Paris", "ari"], False, " P", "ari"),
    ([" Pa", "Par"], False, "", " Pa"),
])
def test_of_stop_strings_completed_together_the_one_ending_first_wins(llm: LLM, stop, include, text,
                                                                      reason) -> None:
    out = llm.generate(P, _greedy(stop=stop, include_stop_str_in_output=include), use_tqdm=False)[0].outputs[0]
    assert (out.text, out.stop_reason, out.finish_reason) == (text, reason, "stop")


def test_a_streamed_request_stops_at_the_same_place(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.add_request("stream", P, _greedy(stop=["aris", "ri"], output_kind=RequestOutputKind.DELTA))
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [out.outputs[0].text for out in engine.step()]
    assert "".join(deltas) == " Pa"


# (The matcher against a brute-force scan by vLLM's rule: tests/security/test_stop_strings.py.)


# -- beam search -----------------------------------------------------------------------------

def test_beam_search_text_starts_with_the_prompt(llm: LLM) -> None:
    out = llm.beam_search([{"prompt": P}], BeamSearchParams(beam_width=2, max_tokens=4))[0]
    prompt_ids = llm.get_tokenizer().encode(P)
    assert [s.text for s in out.sequences] == [P + " Paris.\n\n", P + " Paris.\n-"]  # vLLM's
    for seq in out.sequences:
        assert seq.tokens[:len(prompt_ids)] == prompt_ids


def test_beam_search_refuses_a_constraint_it_cannot_apply() -> None:
    assert BeamSearchParams(beam_width=2, max_tokens=2, structured_outputs=None).structured_outputs is None
    with pytest.raises(ValueError, match=r"BeamSearchParams\.structured_outputs=.*cannot constrain"):
        BeamSearchParams(beam_width=2, max_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+"))


# -- priority, truncation --------------------------------------------------------------------

def test_priority_is_one_int_or_one_per_prompt(llm: LLM) -> None:
    params = SamplingParams(max_tokens=1)
    assert len(llm.generate([P, P], params, priority=0, use_tqdm=False)) == 2
    assert len(llm.chat([CHAT, CHAT], params, use_tqdm=False, priority=[0, 0])) == 2
    with pytest.raises(ValueError, match="priority has 1 entries for 2 prompts"):
        llm.generate([P, P], params, priority=[0], use_tqdm=False)
    with pytest.raises(ValueError, match="priority='x' is invalid: expected an integer"):
        llm.chat(CHAT, params, False, None, "x")  # vLLM's position, after lora_request
    # A non-zero priority needs the priority policy (forkless refuses what it would ignore).
    with pytest.raises(ValueError, match="scheduling policy is 'fcfs'"):
        llm.generate([P, P], params, priority=3, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_truncating_to_max_model_len_leaves_no_room_to_generate_as_in_vllm(llm: LLM) -> None:
    # vLLM's LLM cuts the prompt to max_model_len tokens for -1 and then refuses it.
    long = {"truncate_prompt_tokens": -1}
    with pytest.raises(ValueError, match=f"max_model_len.* is {MAX_MODEL_LEN}"):
        llm.generate("hello " * 100, SamplingParams(max_tokens=2), tokenization_kwargs=long, use_tqdm=False)
    with pytest.raises(ValueError, match=f"max_model_len.* is {MAX_MODEL_LEN}"):
        llm.chat([{"role": "user", "content": "hello " * 100}], SamplingParams(max_tokens=2),
                 tokenization_kwargs=long, use_tqdm=False)
    keep = {"truncate_prompt_tokens": MAX_MODEL_LEN - 1}
    out = llm.generate("hello " * 100, SamplingParams(max_tokens=2), tokenization_kwargs=keep, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == MAX_MODEL_LEN - 1 and len(out.outputs[0].token_ids) == 1


# -- SamplingParams --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [None, 1])
def test_greedy_sampling_allows_one_completion_only(seed) -> None:
    with pytest.raises(ValueError, match=r"SamplingParams\.n=2 is invalid: expected 1 with greedy sampling"):
        SamplingParams(temperature=0, n=2, seed=seed)
    assert SamplingParams(temperature=0.5, n=2).n == 2


@pytest.mark.parametrize("req", [
    CompletionRequest(prompt=P, n=2, temperature=0),
    ChatCompletionRequest(messages=CHAT, n=3, temperature=0.0),
])
def test_the_server_answers_greedy_n_with_a_400_naming_n(req) -> None:
    with pytest.raises(BadRequest) as info:
        to_sampling_params(req, 4, None, 4)
    assert info.value.param == "n" and info.value.status == 400


@pytest.mark.parametrize(("kwargs", "field", "expected"), [
    ({"skip_special_tokens": 0}, "skip_special_tokens=0", "a bool"),
    ({"ignore_eos": "yes"}, "ignore_eos='yes'", "a bool"),
    ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output='no'", "a bool"),
    ({"spaces_between_special_tokens": None}, "spaces_between_special_tokens=None", "a bool"),
    ({"output_kind": 7}, "output_kind=7", "a RequestOutputKind"),
    ({"extra_args": {"x": 2**70}}, "extra_args=", "plain data that msgpack can carry"),
    ({"extra_args": {"x": object()}}, "extra_args=", "plain data that msgpack can carry"),
    ({"temperature": 3.0}, "temperature=3.0", "<= 2"),
])
def test_a_value_of_the_wrong_type_or_range_names_the_field(kwargs, field, expected) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert f"SamplingParams.{field}" in str(info.value) and expected in str(info.value)


def test_vllms_spellings_are_normalised_as_vllm_does() -> None:
    p = SamplingParams(seed=-1, logprobs=True, prompt_logprobs=True, top_k=-1, temperature=2.0)
    assert p.seed is None and p.sampling_type is SamplingType.RANDOM  # unseeded
    assert (p.logprobs, p.prompt_logprobs, p.top_k) == (1, 1, -1)
    empty = SamplingParams(stop=None, stop_token_ids=None, bad_words=None)
    assert (empty.stop, empty.stop_token_ids, empty.bad_words) == ([], [], [])
    assert SamplingParams().stop == []
    # Empty lists stay off the wire, as None did.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams())) == {}


def test_top_k_minus_one_samples_as_no_top_k(llm: LLM) -> None:
    def tokens(top_k: int) -> list[int]:
        params = SamplingParams(top_k=top_k, seed=7, max_tokens=6, ignore_eos=True)
        return list(llm.generate(P, params, use_tqdm=False)[0].outputs[0].token_ids)

    assert tokens(-1) == tokens(0)


def test_logprobs_true_returns_the_best_token_besides_the_sampled_one(llm: LLM) -> None:
    out = llm.generate(P, _greedy(logprobs=True), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids)
    assert all(1 <= len(entry) <= 2 for entry in out.logprobs)


def test_from_optional_takes_none_as_the_default() -> None:
    p = SamplingParams.from_optional(n=None, temperature=None, top_p=None, top_k=None, stop=None,
                                     logit_bias={"5": 500.0, 6: -1e9}, watermarking=None)
    assert p == SamplingParams(logit_bias={5: 100.0, 6: -100.0})  # (vLLM clamps the biases)
    assert SamplingParams.from_optional(max_tokens=None).max_tokens is None  # no limit, as vLLM
    with pytest.raises(ValueError, match="top_p=2.0"):
        SamplingParams.from_optional(top_p=2.0)


def test_eos_token_id_is_the_model_eos_unless_ignored() -> None:
    p = SamplingParams()
    assert p.eos_token_id is None  # not filled by the engine yet
    p.update_from_generation_config({"eos_token_id": [2, 3]}, model_eos_token_id=2)
    assert p.eos_token_id == 2
    q = SamplingParams(ignore_eos=True)
    q.update_from_generation_config({"eos_token_id": 2}, model_eos_token_id=2)
    assert q.eos_token_id is None


# -- outputs and import paths ----------------------------------------------------------------

def test_outputs_have_vllms_attributes(llm: LLM) -> None:
    out = llm.generate(P, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert (out.encoder_prompt, out.encoder_prompt_token_ids, out.kv_transfer_params,
            out.num_cache_creation_tokens) == (None, None, None, None)
    assert out.outputs[0].lora_request is None and out.lora_request is None  # no adapter
    # vLLM's place for a KV connector's parameters; this engine has no connector to take them.
    with pytest.raises(ValueError, match="--kv-transfer-config"):
        llm.generate(P, SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {"x": 1}}), use_tqdm=False)


def test_logprob_imports_from_vllms_module_path() -> None:
    from forkless.logprobs import Logprob as AliasLogprob, PromptLogprobs, SampleLogprobs  # noqa: F401

    assert AliasLogprob is Logprob
