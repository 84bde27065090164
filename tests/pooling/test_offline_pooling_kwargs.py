"""vLLM 0.33's keyword arguments of the offline pooling methods (truncate_prompt_tokens,
tokenization_kwargs, lora_request, pooling_params, chat_template): honoured, or refused
naming the argument. Each was a TypeError (an unexpected keyword) before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forkless import LLM
from forkless.pooling_params import PoolingParams
from forkless.protocol.lora import LoRARequest

TEXT = "A longer prompt about cats and the fish they like to eat"


@pytest.fixture(scope="module")
def embedder(tiny_llama: Path):
    llm = LLM(str(tiny_llama), dtype="float32", convert="embed", kv_cache_memory=16 << 20, max_model_len=128)
    yield llm
    llm.shutdown()


def test_truncate_prompt_tokens_keeps_the_first_tokens(embedder: LLM) -> None:
    whole = embedder.embed([TEXT], use_tqdm=False)[0]
    assert len(whole.prompt_token_ids) > 5
    first5 = whole.prompt_token_ids[:5]
    cut = embedder.embed([TEXT], truncate_prompt_tokens=5, use_tqdm=False)[0]
    assert cut.prompt_token_ids == first5
    # The same as embedding those five tokens: the cut happens before the model.
    ref = embedder.embed([first5], use_tqdm=False)[0]
    assert np.allclose(cut.outputs.embedding, ref.outputs.embedding, atol=1e-6)
    assert not np.allclose(cut.outputs.embedding, whole.outputs.embedding, atol=1e-3)
    # vLLM's other spelling, and token-id and dict prompts, are cut too.
    via_kwargs = embedder.encode([TEXT, whole.prompt_token_ids, {"prompt": TEXT}], pooling_task="embed",
                                 tokenization_kwargs={"truncate_prompt_tokens": 5}, use_tqdm=False)
    assert [o.prompt_token_ids for o in via_kwargs] == [first5] * 3
    reward_cut = embedder.encode([TEXT], pooling_task="token_embed", truncate_prompt_tokens=-1, use_tqdm=False)[0]
    assert reward_cut.prompt_token_ids == whole.prompt_token_ids  # -1: max_model_len, more than it has


def test_add_special_tokens_is_honoured(embedder: LLM) -> None:
    tok = embedder.get_tokenizer()
    plain = embedder.embed([TEXT], tokenization_kwargs={"add_special_tokens": False}, use_tqdm=False)[0]
    assert plain.prompt_token_ids == tok.encode(TEXT, add_special_tokens=False)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"truncate_prompt_tokens": 0}, ValueError, "truncate_prompt_tokens=0 is invalid.*128"),
    ({"truncate_prompt_tokens": 129}, ValueError, "truncate_prompt_tokens=129"),
    ({"tokenization_kwargs": {"padding": True}}, ValueError, r"\['padding'\] are not supported"),
    ({"tokenization_kwargs": {"add_special_tokens": "no"}}, ValueError, "add_special_tokens='no'"),
    ({"truncate_prompt_tokens": 4, "tokenization_kwargs": {"truncate_prompt_tokens": 5}}, ValueError, "disagree"),
    ({"lora_request": LoRARequest("a", 1, "/nowhere")}, ValueError, "without LoRA adapters"),
])
def test_what_cannot_be_honoured_is_refused(embedder: LLM, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        embedder.embed([TEXT], use_tqdm=False, **kwargs)
    assert not embedder.llm_engine.has_unfinished_requests()


def test_vllm_keyword_calls(embedder: LLM) -> None:
    # vLLM's methods take these as keywords (lora_request=None per prompt is fine).
    outs = embedder.embed(["a", "b"], pooling_params=PoolingParams(normalize=False), lora_request=[None, None],
                          use_tqdm=False)
    assert len(outs) == 2 and abs(np.linalg.norm(outs[0].outputs.embedding) - 1.0) > 1e-3
    scores = embedder.score("a", ["a", "b"], pooling_params=PoolingParams(normalize=False),
                            tokenization_kwargs={"truncate_prompt_tokens": 2}, use_tqdm=False)
    assert abs(scores[0].outputs.score - 1.0) < 1e-5
    with pytest.raises(ValueError, match="no score templates"):
        embedder.score("a", "b", chat_template="{{ q }}", use_tqdm=False)
    with pytest.raises(ValueError, match="task='classify'.*'embed'"):
        embedder.score("a", "b", pooling_params=PoolingParams(task="classify"), use_tqdm=False)


def test_cross_encoder_pair_is_truncated(tiny_cross_encoder: Path) -> None:
    llm = LLM(str(tiny_cross_encoder), dtype="float32", kv_cache_memory=8 << 20)
    try:
        long_doc = "Cats eat fish and meat. " * 10
        whole = llm.score("what do cats eat", long_doc, use_tqdm=False)[0]
        cut = llm.score("what do cats eat", long_doc, tokenization_kwargs={"truncate_prompt_tokens": 12},
                        use_tqdm=False)[0]
        assert len(cut.prompt_token_ids) == 12 < len(whole.prompt_token_ids)
        assert cut.outputs.score != whole.outputs.score
        with pytest.raises(ValueError, match="add_special_tokens=False is not supported"):
            llm.score("a", "b", tokenization_kwargs={"add_special_tokens": False}, use_tqdm=False)
    finally:
        llm.shutdown()


def test_pooling_outputs_carry_num_cached_tokens(embedder: LLM) -> None:
    # vLLM's PoolingRequestOutput.num_cached_tokens: the engine core's prefix-cache hits,
    # 0 here even for a repeated prompt, as pooling models run without the prefix cache.
    first, again = embedder.encode([TEXT, TEXT], pooling_task="embed", use_tqdm=False)
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 0
    embedded = embedder.embed([TEXT], use_tqdm=False)[0]
    assert embedded.num_cached_tokens == 0 and embedded.finished
    assert "num_cached_tokens=0" in repr(embedded)
    assert embedder.score(TEXT, ["cats", "fish"], use_tqdm=False)[0].num_cached_tokens == 0
