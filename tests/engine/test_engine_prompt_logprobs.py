"""``SamplingParams.prompt_logprobs`` through the whole engine, against transformers.

Per prompt position the engine returns the log-softmax of the model's logits for the
prompt token plus the top-k (``None`` at position 0). The values must equal transformers'
for the same tiny model however the prompt is computed: batched, chunked, next to a
prefix-cache hit, after preemption, under async scheduling.
"""

from __future__ import annotations

import pytest
import torch

from forkless import LLM, SamplingParams
from forkless.engine.output_processor import OutputProcessor
from forkless.protocol.step import EngineCoreOutput, FinishReason
from forkless.sampling_params import RequestOutputKind

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France; Berlin is",
    "Hello",
    "Numbers 0123456789 and symbols !@#$%^&*() appear too. The quick brown fox jumps over the lazy dog.",
]
TOP = 3


def _engine(model_dir, **kwargs) -> LLM:
    kwargs.setdefault("kv_cache_memory", 1 << 22)
    return LLM(str(model_dir), dtype="float32", **kwargs)


@pytest.fixture(scope="module")
def reference(hf_llama, llama_dir) -> dict[str, torch.Tensor]:
    """Prompt text -> transformers' log-softmax at every prompt position."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir)
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            logits = hf_llama(torch.tensor([tok.encode(prompt)])).logits[0].float()
            out[prompt] = torch.log_softmax(logits, dim=-1)
    return out


def _check(output, ref: torch.Tensor, top: int = TOP) -> None:
    ids = output.prompt_token_ids
    lps = output.prompt_logprobs
    assert lps is not None and len(lps) == len(ids) and lps[0] is None
    for pos in range(1, len(ids)):
        row = ref[pos - 1]  # position pos-1's logits predict prompt token pos
        entry = lps[pos]
        token = ids[pos]
        expected_top = row.topk(top).indices.tolist()
        assert list(entry)[0] == token and set(entry) == {token, *expected_top}
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        for rank, tok_id in enumerate(expected_top, start=1):
            if tok_id != token:
                assert entry[tok_id].rank == rank
        for tok_id, lp in entry.items():
            assert lp.logprob == pytest.approx(row[tok_id].item(), abs=1e-4)
            assert lp.decoded_token is not None


def _generate(llm: LLM, n: int = 1, temperature: float = 0.0, **kwargs):
    params = SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True, prompt_logprobs=TOP, n=n,
                            **kwargs)
    return llm.generate(PROMPTS, params, use_tqdm=False)


def test_prompt_logprobs_match_transformers(llama_dir, reference) -> None:
    llm = _engine(llama_dir)
    for out in _generate(llm):
        _check(out, reference[out.prompt])
    # Without prompt_logprobs there are none.
    plain = llm.generate(PROMPTS[0], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None


def test_prompt_logprobs_zero_gives_the_prompt_token_only(llama_dir, reference) -> None:
    llm = _engine(llama_dir)
    out = llm.generate(PROMPTS[1], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    _check(out, reference[PROMPTS[1]], top=0)
    assert all(len(e) == 1 for e in out.prompt_logprobs[1:])


def test_one_token_prompt_has_only_the_leading_none(llama_dir) -> None:
    llm = _engine(llama_dir)
    out = llm.generate({"prompt_token_ids": [42]}, SamplingParams(max_tokens=2, prompt_logprobs=2),
                       use_tqdm=False)[0]
    assert out.prompt_logprobs == [None]


def test_n_completions_share_one_prompt_logprobs(llama_dir, reference) -> None:
    llm = _engine(llama_dir)
    for out in _generate(llm, n=2, temperature=1.0, seed=1):  # (greedy allows only n=1, as vLLM)
        assert len(out.outputs) == 2
        _check(out, reference[out.prompt])


@pytest.mark.parametrize("kwargs", [
    {"max_num_batched_tokens": 7, "enable_chunked_prefill": True},
    {"block_size": 4, "max_model_len": 64, "max_num_seqs": 3, "kv_cache_memory": 16 * 4 * 2 * 2 * 2 * 16 * 4},
    {"async_scheduling": True},
    {"async_scheduling": True, "max_num_batched_tokens": 7, "enable_chunked_prefill": True},
], ids=["chunked", "preemption", "async", "async-chunked"])
def test_prompt_logprobs_survive_how_the_prompt_is_computed(llama_dir, reference, kwargs) -> None:
    llm = _engine(llama_dir, **kwargs)
    prompts = PROMPTS if "max_model_len" not in kwargs else PROMPTS[:3]  # fit 64 tokens
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=TOP)
    for out in llm.generate(prompts, params, use_tqdm=False):
        _check(out, reference[out.prompt])
    if "max_model_len" in kwargs:
        assert llm.llm_engine.make_stats().num_preemptions > 0
    llm.llm_engine.engine_core.step()  # collects a step still in flight (async)
    kv = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_prompt_logprobs_requests_do_not_read_the_prefix_cache(llama_dir, reference) -> None:
    llm = _engine(llama_dir, block_size=4, enable_prefix_caching=True)
    warm = llm.generate(PROMPTS, SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=2), use_tqdm=False)[0].num_cached_tokens > 0
    assert all(o.prompt_logprobs is None for o in warm)
    for out in _generate(llm):
        assert out.num_cached_tokens == 0  # every prompt position was computed
        _check(out, reference[out.prompt])


def test_prompt_logprobs_beyond_the_vocabulary_are_rejected(llama_dir) -> None:
    llm = _engine(llama_dir)
    vocab = llm.llm_engine.config.model_config.vocab_size
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llm.generate(PROMPTS[0], SamplingParams(prompt_logprobs=vocab + 1), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_logprobs_over_max_logprobs_are_refused(llama_dir) -> None:
    # vLLM's --max-logprobs (default 20) caps both counts; -1 asks for the whole vocabulary.
    llm = _engine(llama_dir)
    for params in (SamplingParams(logprobs=21), SamplingParams(prompt_logprobs=21), SamplingParams(logprobs=-1)):
        with pytest.raises(ValueError, match="--max-logprobs"):
            llm.generate(PROMPTS[0], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate(PROMPTS[0], SamplingParams(logprobs=20, max_tokens=1), use_tqdm=False)[0]
               .outputs[0].logprobs[0]) >= 20


def test_minus_one_returns_the_whole_vocabulary(llama_dir, reference) -> None:
    llm = _engine(llama_dir, max_logprobs=-1)
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=0, max_tokens=2, logprobs=-1, prompt_logprobs=-1)
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None
    for pos, entry in enumerate(out.prompt_logprobs[1:], start=1):
        assert len(entry) == vocab
        row = reference[prompt][pos - 1]
        token = out.prompt_token_ids[pos]
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
    for step, token in zip(out.outputs[0].logprobs, out.outputs[0].token_ids):
        assert len(step) == vocab
        assert step[token].rank == 1  # greedy
        total = torch.logsumexp(torch.tensor([lp.logprob for lp in step.values()]), 0)
        assert total.item() == pytest.approx(0.0, abs=1e-3)  # a whole distribution


def test_delta_outputs_carry_prompt_logprobs_once(llama_dir) -> None:
    from transformers import AutoTokenizer

    from forkless.config import EngineArgs
    from forkless.engine.processor import Processor

    tok = AutoTokenizer.from_pretrained(llama_dir)
    processor = Processor(EngineArgs(model=str(llama_dir)).create_engine_config(), tok)
    raw = [[[5, 7], [-1.5, -0.5], 2], None]  # position 1 scored, position 2 not computed
    for kind, expected in [(RequestOutputKind.DELTA, [True, False, False]),
                           (RequestOutputKind.CUMULATIVE, [True, True, True])]:
        out_proc = OutputProcessor(tok)
        params = SamplingParams(prompt_logprobs=1, output_kind=kind)
        out_proc.add_request(processor.process_inputs("r", {"prompt_token_ids": [3, 5, 9]}, params))
        steps = [EngineCoreOutput("r", [11], new_prompt_logprobs=raw), EngineCoreOutput("r", [12]),
                 EngineCoreOutput("r", [13], FinishReason.LENGTH)]
        outs = [out_proc.process_outputs([s]).request_outputs[0] for s in steps]
        assert [o.prompt_logprobs is not None for o in outs] == expected
        first = outs[0].prompt_logprobs
        assert first[0] is None and first[2] is None
        assert first[1][5].logprob == -1.5 and first[1][5].rank == 2
        assert first[1][7].rank == 1 and first[1][7].decoded_token == tok.decode([7])
