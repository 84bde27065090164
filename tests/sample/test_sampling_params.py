"""SamplingParams: validation messages, normalization, msgpack round trip."""

import msgspec
import pytest

from forkless import SamplingParams
from forkless.outputs import CompletionOutput, Logprob, RequestOutput
from forkless.sampling_params import SamplingType


@pytest.mark.parametrize(
    ("kwargs", "field", "expected"),
    [
        ({"temperature": -0.1}, "temperature=-0.1", ">= 0"),
        ({"top_p": 0.0}, "top_p=0.0", "(0, 1]"),
        ({"top_p": 1.5}, "top_p=1.5", "(0, 1]"),
        ({"top_k": -2}, "top_k=-2", "0 / -1 to disable"),
        ({"min_p": 1.1}, "min_p=1.1", "[0, 1]"),
        ({"min_p": -0.1}, "min_p=-0.1", "[0, 1]"),
        ({"max_tokens": 0}, "max_tokens=0", ">= 1"),
        ({"min_tokens": -1}, "min_tokens=-1", ">= 0"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens=20", "<= max_tokens (10)"),
        ({"n": 0}, "n=0", ">= 1"),
        ({"presence_penalty": 2.5}, "presence_penalty=2.5", "[-2, 2]"),
        ({"frequency_penalty": -3.0}, "frequency_penalty=-3.0", "[-2, 2]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty=0.0", "> 0"),
        ({"logprobs": -2}, "logprobs=-2", "-1 for the whole vocabulary"),
        ({"prompt_logprobs": -2}, "prompt_logprobs=-2", "-1 for the whole vocabulary"),
        ({"logprobs": 1.5}, "logprobs=1.5", "an integer"),
        ({"stop_token_ids": [-5]}, "stop_token_ids=[-5]", "token ids >= 0"),
        ({"stop": ["ok", ""]}, "stop=", "non-empty"),
        ({"stop": 5}, "stop=5", "a non-empty string or a list"),
        ({"stop_token_ids": "12"}, "stop_token_ids='12'", "a list of token ids"),
        ({"top_k": 2**70}, "top_k=", "64-bit"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias=", "integer token ids"),
        ({"temperature": float("nan")}, "temperature=nan", ">= 0"),
        ({"allowed_token_ids": []}, "allowed_token_ids=[]", "non-empty list of token ids"),
        ({"allowed_token_ids": [3, -1]}, "allowed_token_ids=[3, -1]", "token ids >= 0"),
        ({"bad_words": ["ok", ""]}, "bad_words=", "not empty or only whitespace"),
        ({"bad_words": ["  "]}, "bad_words=", "not empty or only whitespace"),
        ({"bad_words": "word"}, "bad_words='word'", "a list of strings"),
        ({"bad_words": ["ok", "\ud800"]}, "bad_words=", "valid Unicode"),
        ({"bad_words": [f"w{i}" for i in range(129)]}, "bad_words=", "at most 128 words"),
        ({"bad_words_token_ids": [[]]}, "bad_words_token_ids=", "non-empty lists"),
    ],
)
def test_bad_value_names_field_value_and_expectation(kwargs, field, expected):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert f"SamplingParams.{field}" in message
    assert expected in message


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert p.max_tokens == 16 and p.min_tokens == 0 and p.logprobs is None
    assert p.sampling_type is SamplingType.RANDOM
    assert SamplingParams(seed=1).sampling_type is SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.0).sampling_type is SamplingType.GREEDY
    assert SamplingParams(temperature=1e-6, seed=3).sampling_type is SamplingType.GREEDY


def test_normalization():
    p = SamplingParams(stop="###", top_k=-1, logit_bias={"5": 2})
    assert p.stop == ["###"]
    assert p.top_k == -1  # kept, as vLLM keeps it (the sampler reads it as "off", as 0)
    assert p.logit_bias == {5: 2.0}
    assert SamplingParams(max_tokens=None, min_tokens=1000).max_tokens is None


def test_keyword_only():
    with pytest.raises(TypeError):
        SamplingParams(2)  # type: ignore[misc]


def test_msgpack_round_trip_keeps_every_field():
    p = SamplingParams(
        n=2, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=7, max_tokens=32,
        min_tokens=2, stop=["\n\n", "END"], stop_token_ids=[3], ignore_eos=True, logprobs=5,
        prompt_logprobs=1, presence_penalty=0.5, frequency_penalty=-0.5,
        repetition_penalty=1.1, logit_bias={10: -100.0, 11: 2.5}, skip_special_tokens=False,
        include_stop_str_in_output=True, extra_args={"force_token": 3, "nested": {"a": [1]}},
        allowed_token_ids=[1, 2], bad_words=["x y"], bad_words_token_ids=[[4, 5]],
        spaces_between_special_tokens=False,
    )
    data = msgspec.msgpack.encode(p)
    assert msgspec.msgpack.decode(data, type=SamplingParams) == p
    # omit_defaults keeps the wire format small for the common case.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams())) == {}


def test_decoding_a_bad_value_is_rejected_on_the_receiving_side():
    data = msgspec.msgpack.encode({"top_p": 2.0})
    with pytest.raises(msgspec.ValidationError, match="top_p=2.0"):
        msgspec.msgpack.decode(data, type=SamplingParams)


def test_json_logit_bias_string_keys():
    p = msgspec.json.decode(b'{"logit_bias": {"50256": -100}}', type=SamplingParams)
    assert p.logit_bias == {50256: -100.0}


def test_clone_and_replace_are_independent_and_validated():
    p = SamplingParams(stop=["a"], extra_args={"k": [1]})
    c = p.clone()
    c.stop.append("b")  # type: ignore[union-attr]
    c.extra_args["k"].append(2)  # type: ignore[index]
    assert p.stop == ["a"] and p.extra_args == {"k": [1]}
    r = msgspec.structs.replace(p, temperature=0.0)
    assert r.sampling_type is SamplingType.GREEDY and p.temperature == 1.0
    with pytest.raises(ValueError, match="temperature=-1"):
        msgspec.structs.replace(p, temperature=-1.0)


def test_eos_ids_from_generation_config_feed_all_stop_token_ids():
    p = SamplingParams(stop_token_ids=[9], ignore_eos=True)
    p.update_from_generation_config({"eos_token_id": [2, 3]}, model_eos_token_id=2)
    assert p.eos_token_ids == [2, 3]
    assert p.all_stop_token_ids == {2, 3, 9}


def test_request_output_round_trip():
    out = RequestOutput(
        request_id="r1", prompt="hi", prompt_token_ids=[1, 2], finished=True,
        num_cached_tokens=0,
        outputs=[CompletionOutput(
            index=0, text=" there", token_ids=[5], cumulative_logprob=-0.1,
            logprobs=[{5: Logprob(-0.1, 1, " there"), 6: Logprob(-2.3, 2, " you")}],
            finish_reason="stop", stop_reason=None,
        )],
    )
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(out), type=RequestOutput)
    assert back == out
    assert back.outputs[0].finished()
    assert back.outputs[0].logprobs[0][6].rank == 2  # type: ignore[index]


class _SpaceTokenizer:
    """Encodes a word to one id per character, and a leading space to its own id 0."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_bad_words_are_tokenized_with_and_without_a_leading_space_once_each():
    p = SamplingParams(bad_words=["ab", "  ab", "c", "ab"])
    assert p.bad_words == ["ab", "  ab", "c"]  # exact duplicates dropped
    p.update_from_tokenizer(_SpaceTokenizer())
    # "  ab" strips to "ab": its sequences are already there.
    assert p.bad_words_token_ids == [[97, 98], [32, 97, 98], [99], [32, 99]]
    none = SamplingParams()
    none.update_from_tokenizer(_SpaceTokenizer())
    assert none.bad_words_token_ids is None


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"guided_decoding": {"json": {}}}, "guided_decoding"),
    ({"logprob_token_ids": [3]}, "logprob_token_ids"),
    ({"best_of": 3}, "best_of"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),
    ({"logits_processors": [lambda ids, logits: logits]}, "logits_processors"),
    ({"flat_logprobs": True}, "flat_logprobs"),
])
def test_vllm_arguments_forkless_does_not_implement_are_value_errors(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}=.* is not supported by forkless"):
        SamplingParams(**kwargs)


def test_thinking_token_budget_takes_vllms_values():
    # As vLLM's validate_thinking_token_budget: -1 is no limit, other negatives, bools and
    # floats are refused.
    assert SamplingParams(thinking_token_budget=0).thinking_token_budget == 0
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None
    for bad in (-2, True, 1.5, "3"):
        with pytest.raises(ValueError, match=r"SamplingParams\.thinking_token_budget=.* is invalid"):
            SamplingParams(thinking_token_budget=bad)
    with pytest.raises(ValueError, match="reasoning_end_token_ids"):
        SamplingParams(thinking_token_budget=2, reasoning_start_token_ids=[1], reasoning_end_token_ids=[])


def test_beam_search_arguments_point_to_llm_beam_search():
    # Beam search exists offline (LLM.beam_search, docs/sampling.md): the errors say where.
    for kwargs in ({"use_beam_search": True}, {"length_penalty": 0.5}, {"early_stopping": True}):
        with pytest.raises(ValueError, match=r"LLM\.beam_search") as info:
            SamplingParams(**kwargs)
        assert "not implemented" not in str(info.value)


def test_vllm_arguments_at_their_do_nothing_values_are_accepted_and_dropped():
    p = SamplingParams(best_of=1, use_beam_search=False, structured_outputs=None, skip_clone=True,
                       stream_interval=None, flat_logprobs=False, temperature=0.5)
    assert p == SamplingParams(temperature=0.5)
    with pytest.raises(TypeError, match="not_a_field"):
        SamplingParams(not_a_field=1)  # an unknown name stays Python's own error
