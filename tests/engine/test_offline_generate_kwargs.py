"""vLLM 0.33's keyword arguments of the offline LLM's generation methods and cache
control: generate / chat ``tokenization_kwargs`` and ``reset_prefix_cache``'s
``reset_running_requests`` / ``reset_connector``, honoured or refused naming the value.
Each was a TypeError (an unexpected keyword) before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from forkless import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TEXT = "The quick brown fox jumps over the lazy dog and runs far away into the woods"
LONG = " ".join(["Once upon a time there was a little robot who liked to count numbers."] * 4)
CHAT = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def llm(tiny_llama: Path):
    engine = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24)
    yield engine
    engine.shutdown()


def _tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def test_generate_truncates_on_the_left_and_picks_special_tokens(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    ids = tok.encode(TEXT)
    last5 = ids[-5:]
    cut = llm.generate([TEXT, {"prompt": TEXT, "cache_salt": "s"}, ids], GREEDY, use_tqdm=False,
                       tokenization_kwargs={"truncate_prompt_tokens": 5})
    assert [o.prompt_token_ids for o in cut] == [last5] * 3
    assert cut[0].prompt == tok.decode(last5) and cut[2].prompt is None
    # The same tokens as generating from those five tokens: the cut happens before the model.
    assert _tokens(cut) == _tokens(llm.generate([last5], GREEDY, use_tqdm=False)) * 3
    plain = llm.generate(TEXT, GREEDY, use_tqdm=False, tokenization_kwargs={"add_special_tokens": False})[0]
    assert plain.prompt_token_ids == tok.encode(TEXT, add_special_tokens=False)
    whole = llm.generate(TEXT, GREEDY, use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": -1})[0]
    assert whole.prompt_token_ids == ids and whole.prompt == TEXT


def test_chat_tokenization_kwargs(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    rendered = llm.chat(CHAT, GREEDY, use_tqdm=False)[0]
    assert llm.chat(CHAT, GREEDY, use_tqdm=False, tokenization_kwargs={})[0].prompt_token_ids == \
        rendered.prompt_token_ids
    cut = llm.chat(CHAT, GREEDY, use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": 4})[0]
    assert cut.prompt_token_ids == rendered.prompt_token_ids[-4:]
    special = llm.chat(CHAT, GREEDY, use_tqdm=False, tokenization_kwargs={"add_special_tokens": True})[0]
    assert special.prompt_token_ids == tok.encode(rendered.prompt, add_special_tokens=True)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"truncation": True}, ValueError, r"\['truncation'\] are not supported.*truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": 0}, ValueError, "truncate_prompt_tokens=0 is invalid.*256"),
    ({"truncate_prompt_tokens": 257}, ValueError, "truncate_prompt_tokens=257 is invalid"),
    ({"add_special_tokens": "yes"}, ValueError, "add_special_tokens='yes' is invalid"),
])
def test_generate_refuses_what_it_cannot_honour(llm: LLM, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        llm.generate(TEXT, GREEDY, use_tqdm=False, tokenization_kwargs=kwargs)
    with pytest.raises(error, match=match):
        llm.chat(CHAT, GREEDY, use_tqdm=False, tokenization_kwargs=kwargs)
    with pytest.raises(TypeError, match="tokenization_kwargs must be a dict"):
        llm.generate(TEXT, GREEDY, use_tqdm=False, tokenization_kwargs=[("add_special_tokens", False)])
    with pytest.raises(TypeError, match="tokenization_kwargs must be a dict, got str"):
        llm.generate(TEXT, GREEDY, use_tqdm=False, tokenization_kwargs="add_special_tokens")
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_prompt_that_is_not_one_is_a_value_error(llm: LLM) -> None:
    for prompts in (5, b"bytes"):
        with pytest.raises(ValueError, match=r"prompts=.* is not a prompt: expected a string, token ids"):
            llm.generate(prompts, GREEDY, use_tqdm=False)
    # Any iterable of prompts still is one (vLLM takes sequences; a generator works too).
    assert len(llm.generate((t for t in [TEXT, TEXT]), GREEDY, use_tqdm=False)) == 2


def test_reset_prefix_cache_forgets_prefixes(llm: LLM, caplog: pytest.LogCaptureFixture) -> None:
    llm.generate(LONG, GREEDY, use_tqdm=False)
    assert llm.generate(LONG, GREEDY, use_tqdm=False)[0].num_cached_tokens > 0
    assert llm.reset_prefix_cache() is True
    assert llm.generate(LONG, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    assert llm.generate(LONG, GREEDY, use_tqdm=False)[0].num_cached_tokens > 0
    # No connector to reset, as vLLM: a warning, and False (the local cache is reset still).
    logging.getLogger("forkless").addHandler(caplog.handler)  # forkless does not propagate
    try:
        assert llm.reset_prefix_cache(reset_connector=True) is False
    finally:
        logging.getLogger("forkless").removeHandler(caplog.handler)
    assert "reset_prefix_cache(reset_connector=True): no KV connector is configured" in caplog.text
    assert llm.generate(LONG, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    with pytest.raises(ValueError, match=r"reset_prefix_cache\(reset_running_requests='yes'\) is invalid"):
        llm.reset_prefix_cache(reset_running_requests="yes")


def test_reset_running_requests_preempts_and_recomputes(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = _tokens(llm.generate(TEXT, params, use_tqdm=False))
    engine = llm.llm_engine
    scheduler = engine.engine_core.scheduler
    engine.add_request("running-1", TEXT, params)
    for _ in range(3):
        assert not [o for o in engine.step() if o.finished]
    assert len(scheduler.running) == 1
    before = scheduler.num_preemptions
    assert llm.reset_prefix_cache(reset_running_requests=True)
    assert scheduler.num_preemptions == before + 1 and not scheduler.running
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    # Computed again from its first token, it ends with the same greedy tokens.
    assert _tokens(finished) == expected


def test_chat_refuses_a_generation_prompt_after_a_continued_message(llm: LLM) -> None:
    # As vLLM's LLM.chat (and the server's 400): both cannot hold at once.
    with pytest.raises(ValueError, match="add_generation_prompt=False to continue"):
        llm.chat(CHAT, GREEDY, use_tqdm=False, continue_final_message=True)
    assert llm.chat(CHAT, GREEDY, use_tqdm=False, continue_final_message=True, add_generation_prompt=False)
