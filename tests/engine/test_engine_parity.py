"""forkless greedy generation equals transformers' greedy ``generate`` token for token.

The prompts run batched through forkless (different lengths, in one engine) and one at a
time through transformers. The same must hold under preemption, chunked prefill and
prefix caching, which change how the KV cache is filled but never the result.
"""

from __future__ import annotations

import pytest
import torch

from forkless import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox",
    "Paris is the capital of France; Berlin is",
    "Hello",
    "Numbers 0123456789 and symbols !@#$%^&*() appear too. The quick brown fox jumps over the lazy dog.",
    "Caf\u00e9 cr\u00e8me",
]
MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@torch.inference_mode()
def hf_greedy(hf_model, prompt_ids: list[int], n: int) -> list[int]:
    out = hf_model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, pad_token_id=1,
    )
    return out[0, len(prompt_ids):].tolist()


def _engine(model_dir, **kwargs) -> LLM:
    kwargs.setdefault("kv_cache_memory", 1 << 22)
    return LLM(str(model_dir), dtype="float32", **kwargs)


def _hf_expected(hf_model, llm: LLM) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [hf_greedy(hf_model, tok.encode(p), MAX_TOKENS) for p in PROMPTS]


@pytest.fixture(scope="module")
def expected(hf_llama, llama_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir)
    return [hf_greedy(hf_llama, tok.encode(p), MAX_TOKENS) for p in PROMPTS]


def _generated(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outputs] == PROMPTS
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    return [o.outputs[0].token_ids for o in outputs]


def _assert_no_leak(llm: LLM) -> None:
    kv = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks


def test_batched_greedy_matches_transformers(llama_dir, expected) -> None:
    llm = _engine(llama_dir)
    assert _generated(llm) == expected
    _assert_no_leak(llm)


def test_qwen3_batched_greedy_matches_transformers(qwen3_dir) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    llm = _engine(qwen3_dir)
    assert _generated(llm) == _hf_expected(hf, llm)


def test_preemption_with_tiny_kv_budget_keeps_outputs(llama_dir, expected) -> None:
    # 16 blocks of 4 tokens: room for one 64-token sequence, so 3 running requests of ~30
    # tokens must preempt each other; 2 seqs at a time with 5 requests queues the rest.
    llm = _engine(llama_dir, block_size=4, max_model_len=64, max_num_seqs=3,
                  kv_cache_memory=16 * 4 * 2 * 2 * 2 * 16 * 4)
    assert llm.llm_engine.config.cache_config.num_blocks == 16
    assert _generated(llm) == expected
    assert llm.llm_engine.make_stats().num_preemptions > 0
    _assert_no_leak(llm)


def test_chunked_prefill_keeps_outputs(llama_dir, expected) -> None:
    llm = _engine(llama_dir, max_num_batched_tokens=7, enable_chunked_prefill=True)
    assert _generated(llm) == expected
    _assert_no_leak(llm)


@pytest.mark.parametrize("enable", [True, False])
def test_prefix_caching_on_off_same_outputs(llama_dir, expected, enable: bool) -> None:
    llm = _engine(llama_dir, block_size=4, enable_prefix_caching=enable)
    assert _generated(llm) == expected
    # The second round finds every full prompt block in the cache (when caching is on).
    assert _generated(llm) == expected
    stats = llm.llm_engine.make_stats()
    assert (stats.prefix_cache_hits > 0) == enable
    _assert_no_leak(llm)


def test_logprobs_match_transformers_log_softmax(llama_dir, hf_llama) -> None:
    llm = _engine(llama_dir)
    prompt_ids = llm.get_tokenizer().encode(PROMPTS[1])
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3)
    out = llm.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)[0].outputs[0]
    seq = prompt_ids + out.token_ids
    with torch.inference_mode():
        ref = torch.log_softmax(hf_llama(torch.tensor([seq])).logits[0].float(), dim=-1)
    total = 0.0
    for step, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(prompt_ids) + step - 1]
        assert entry[token].rank == 1  # greedy picks the most likely token
        top = row.topk(3)
        assert list(entry)[:1] == [token] and set(entry) == set(top.indices.tolist())
        for tok_id, lp in entry.items():
            assert lp.logprob == pytest.approx(row[tok_id].item(), abs=1e-4)
        total += entry[token].logprob
    assert out.cumulative_logprob == pytest.approx(total, abs=1e-4)


# --async-scheduling: step N+1 is scheduled and launched before step N's tokens reach
# the host (they are fed on the device). Greedy outputs must not change, under
# preemption, chunked prefill and prefix caching too.
@pytest.mark.parametrize("kwargs", [
    {},
    {"block_size": 4, "max_model_len": 64, "max_num_seqs": 3, "kv_cache_memory": 16 * 4 * 2 * 2 * 2 * 16 * 4},
    {"max_num_batched_tokens": 7, "enable_chunked_prefill": True},
    {"block_size": 4, "enable_prefix_caching": True},
], ids=["plain", "preemption", "chunked", "prefix-cache"])
def test_async_scheduling_keeps_greedy_outputs(llama_dir, expected, kwargs) -> None:
    llm = _engine(llama_dir, async_scheduling=True, **kwargs)
    assert llm.llm_engine.engine_core.async_scheduling
    assert _generated(llm) == expected
    assert _generated(llm) == expected  # a second round (prefix hits, leftover state)
    if "max_num_seqs" in kwargs:
        assert llm.llm_engine.make_stats().num_preemptions > 0
    llm.llm_engine.engine_core.step()  # collects the last step still in flight
    _assert_no_leak(llm)


def test_async_scheduling_eos_stops_and_history_dependent_params(llama_dir) -> None:
    # EOS / stop-token finishes are only known when the tokens arrive: the step already
    # launched for such a request is discarded. Seeded and penalised requests read
    # their own latest tokens, so the engine steps synchronously while they run; their
    # outputs must equal the synchronous engine's.
    params = [
        SamplingParams(temperature=0.0, max_tokens=20),
        SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[5, 17, 42]),
        SamplingParams(temperature=0.8, seed=3, max_tokens=10),
        SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.3, min_tokens=4),
        SamplingParams(temperature=0.0, max_tokens=15, logprobs=2),
    ]

    def run(**kw):
        llm = _engine(llama_dir, **kw)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason,
                 [sorted(e) for e in o.outputs[0].logprobs or []]) for o in outs]

    assert run(async_scheduling=True) == run()
