"""Sampling behaviour through the whole engine: seeds, stops, lengths, n, processors."""

from __future__ import annotations

import pytest

from forkless import LLM, SamplingParams

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(llama_dir) -> LLM:
    return LLM(str(llama_dir), kv_cache_memory=1 << 22,
               logits_processors="tests.sample.sample_force_token:ForceTokenLogitsProcessor")


def _one(llm: LLM, params: SamplingParams, prompt=PROMPT):
    return llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]


def test_same_seed_same_text_even_in_another_batch(llm) -> None:
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    alone = _one(llm, params)
    others = [SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True) for n in (3, 20, 7)]
    batch = llm.generate(["Hello", PROMPT, "Paris is", PROMPT], [others[0], params, others[1], others[2]],
                         use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone.token_ids
    assert batch[1].outputs[0].text == alone.text
    different = _one(llm, SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True))
    assert different.token_ids != alone.token_ids


def test_max_tokens_and_min_tokens(llm) -> None:
    out = _one(llm, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    # EOS is forced by a logit bias; min_tokens masks it until 4 tokens exist.
    eos = llm.get_tokenizer().eos_token_id
    out = _one(llm, SamplingParams(temperature=0, max_tokens=10, min_tokens=4, logit_bias={eos: 100.0}))
    assert out.token_ids[-1] == eos and len(out.token_ids) == 5 and out.finish_reason == "stop"
    out = _one(llm, SamplingParams(temperature=0, max_tokens=6, logit_bias={eos: 100.0}, ignore_eos=True))
    assert out.token_ids == [eos] * 6 and out.finish_reason == "length"


def test_stop_token_ids(llm) -> None:
    free = _one(llm, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    stop_tok = free.token_ids[3]
    first = free.token_ids.index(stop_tok)
    out = _one(llm, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_tok]))
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok


def test_stop_strings_truncate_and_abort(llm) -> None:
    free = _one(llm, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, skip_special_tokens=False))
    text = free.text
    stop = text[5:8]
    start = text.index(stop)
    out = _one(llm, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop],
                                   skip_special_tokens=False))
    assert out.text == text[:start]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert len(out.token_ids) < len(free.token_ids)  # the engine core stopped generating
    kept = _one(llm, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=stop,
                                    include_stop_str_in_output=True, skip_special_tokens=False))
    assert kept.text == text[: start + len(stop)]
    kv = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_n_completions(llm) -> None:
    out = llm.generate(PROMPT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)
    assert len(out) == 1
    completions = out[0].outputs
    assert [c.index for c in completions] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in completions)
    assert len({tuple(c.token_ids) for c in completions}) > 1
    again = llm.generate(PROMPT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True),
                         use_tqdm=False)
    assert [c.token_ids for c in again[0].outputs] == [c.token_ids for c in completions]


def test_custom_logits_processor_only_for_requests_that_ask(llm) -> None:
    forced = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, extra_args={"force_token": 42})
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    reference = _one(llm, plain)
    outs = llm.generate([PROMPT, PROMPT], [forced, plain], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == [42] * 4
    assert outs[1].outputs[0].token_ids == reference.token_ids
    with pytest.raises(ValueError, match="force_token"):
        llm.generate(PROMPT, SamplingParams(extra_args={"force_token": "x"}), use_tqdm=False)


def test_builtin_logit_bias_changes_output(llm) -> None:
    out = _one(llm, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={77: 50.0}))
    assert out.token_ids == [77, 77, 77]


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_invalid_sampling_values_raise(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_requests_raise_clear_errors_and_leave_nothing_running(llm) -> None:
    limit = llm.llm_engine.config.model_config.max_model_len
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * limit}, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []}, use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate(PROMPT, SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="scheduling-policy priority"):
        llm.generate(PROMPT, use_tqdm=False, priority=[3])
    assert not llm.llm_engine.has_unfinished_requests()
    assert _one(llm, SamplingParams(max_tokens=2)).token_ids  # still serves


def test_allowed_token_ids_restrict_every_sampled_token(llm) -> None:
    allowed = [5, 77, 100, 200, 300]
    params = SamplingParams(temperature=1.5, seed=3, max_tokens=40, ignore_eos=True, allowed_token_ids=allowed)
    plain = SamplingParams(temperature=1.5, seed=3, max_tokens=40, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT], [params, plain], use_tqdm=False)
    restricted = outs[0].outputs[0].token_ids
    assert len(restricted) == 40 and set(restricted) <= set(allowed)
    assert len(set(restricted)) > 1  # sampled among them, not forced to one
    assert not set(outs[1].outputs[0].token_ids) <= set(allowed)  # the other request is free
    greedy = _one(llm, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, allowed_token_ids=[200]))
    assert greedy.token_ids == [200] * 6
    vocab = llm.llm_engine.config.model_config.vocab_size
    with pytest.raises(ValueError, match="allowed_token_ids.*outside the vocabulary"):
        _one(llm, SamplingParams(allowed_token_ids=[1, vocab]))


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_bad_words_never_appear(llama_dir, async_scheduling) -> None:
    llm = LLM(str(llama_dir), kv_cache_memory=1 << 22, async_scheduling=async_scheduling)
    tok = llm.get_tokenizer()
    free = _one(llm, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    # A two-token word and a one-token word the free greedy output does contain.
    word = tok.decode(free.token_ids[4:6])
    single = tok.decode(free.token_ids[1:2])
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=[word, single])
    probe = params.clone()
    probe.update_from_tokenizer(tok)
    sequences = probe.bad_words_token_ids
    assert any(_contains(free.token_ids, s) for s in sequences)
    banned = _one(llm, params)
    assert len(banned.token_ids) == 24
    assert not any(_contains(banned.token_ids, s) for s in sequences), (sequences, banned.token_ids)
    # Only what is banned changes: the output agrees with the free one up to the first ban.
    first = min(i for i, t in enumerate(free.token_ids) if any(_contains(free.token_ids[:i + 1], s) for s in sequences))
    assert banned.token_ids[:first] == free.token_ids[:first]


def test_skip_special_tokens_decides_whether_special_tokens_are_in_the_text(llm) -> None:
    tok = llm.get_tokenizer()
    special = tok.convert_tokens_to_ids("<|im_start|>")
    forced = dict(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={special: 100.0})
    skipped = _one(llm, SamplingParams(**forced))
    kept = _one(llm, SamplingParams(**forced, skip_special_tokens=False))
    assert skipped.token_ids == kept.token_ids == [special] * 3
    assert skipped.text == "" and kept.text == "<|im_start|>" * 3


@pytest.mark.parametrize("spaces", [True, False])
def test_spaces_between_special_tokens_follow_the_tokenizer(llm, spaces) -> None:
    # vLLM semantics: only slow (Python) tokenizers honour the flag; a fast tokenizer's
    # decoder joins special tokens as they are. The text equals transformers' decode.
    tok = llm.get_tokenizer()
    special = tok.convert_tokens_to_ids("<|im_end|>")
    out = _one(llm, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logit_bias={special: 5.0},
                                   skip_special_tokens=False, spaces_between_special_tokens=spaces))
    assert special in out.token_ids
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=False, spaces_between_special_tokens=spaces)
