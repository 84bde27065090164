"""Speculative decoding with ``draft_model``: a second model in the worker, with its own
paged KV cache, guesses; greedy outputs are token for token those of plain decoding, a
draft that is the target itself has every guess accepted, another draft some or none,
through prefix-cache hits, chunked prefill, preemption, stops, ``max_tokens``, logprobs
and mixed batches, uni and mp executors. Also: a proposer that reads the target's hidden
states gets exactly them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from forkless.entrypoints.llm import LLM
from forkless.sampling_params import SamplingParams
from forkless.spec_decode import ProposalBatch, Proposer
from forkless.spec_decode.ngram import propose_ngram
from tests.engine.tiny_models import make_model
from tests.spec_decode import test_engine_spec as ngram_tests

K = 3
PROMPTS = ngram_tests.PROMPTS
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def _perturbed(target: Path, out: Path, noise: float) -> Path:
    """A copy of ``target`` with noise on its last MLP: mostly the same guesses, not all."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(target, out)
    weights = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if "layers.1.mlp" in name:
            tensor += noise * tensor.std() * torch.randn(tensor.shape, generator=gen)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("draft-models")
    target = make_model(root / "target", "llama")
    return {
        "target": target,
        # Another architecture (other KV heads and head size) and other weights: about
        # no guess is right, and its own cache has another shape.
        "other": make_model(root / "other", "qwen3", seed=1),
        "near": _perturbed(target, root / "near", 0.3),
    }


def _spec(draft: Path, **extra: Any) -> dict[str, Any]:
    return {"model": str(draft), "num_speculative_tokens": K, **extra}


def _tokens(llm: LLM, prompts: list[str], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def _stats(llm: LLM):
    stats = llm.llm_engine.engine_core.make_stats().spec_decode
    assert stats is not None
    return stats


@pytest.fixture(scope="module")
def reference(models: dict[str, Path]) -> LLM:
    llm = LLM(str(models["target"]), max_model_len=256)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("executor", ["uni", "mp"])
def test_draft_of_the_same_model_has_every_guess_accepted(models: dict[str, Path], reference: LLM,
                                                          executor: str) -> None:
    expected = _tokens(reference, PROMPTS, GREEDY)
    # No "method": a draft "model" alone means draft_model, as in vLLM.
    llm = LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["target"]),
              distributed_executor_backend=executor)
    try:
        assert _tokens(llm, PROMPTS, GREEDY) == expected
        # Again: the prompts now hit the prefix cache, whose blocks the draft's cache
        # holds too (else its guesses would go wrong and be rejected).
        assert _tokens(llm, PROMPTS, GREEDY) == expected
        stats = _stats(llm)
        assert stats.num_drafts > 0 and stats.num_draft_tokens > stats.num_drafts
        assert stats.num_accepted_tokens == stats.num_draft_tokens
        assert stats.num_accepted_tokens_per_pos[0] == stats.num_drafts
        # Every step emits up to k + 1 tokens: far fewer steps than tokens.
        assert stats.num_drafts < sum(map(len, expected)) * 2 / (K + 1) + len(PROMPTS) * 2
    finally:
        llm.shutdown()


def test_async_scheduling_keeps_the_drafts_cache_right(models: dict[str, Path], reference: LLM) -> None:
    """Under --async-scheduling the step after a prompt runs with the prompt's sampled token
    still on the device: the draft's own cache must get that token, not the placeholder, or
    its later guesses would be rejected. With the same model as draft, every one is kept."""
    params = [GREEDY, GREEDY, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=1), GREEDY]
    expected = _tokens(reference, PROMPTS, params)
    llm = LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["target"]),
              async_scheduling=True, distributed_executor_backend="mp")
    try:
        assert llm.llm_engine.engine_core.async_scheduling
        assert _tokens(llm, PROMPTS, params) == expected
        stats = _stats(llm)
        assert stats.num_drafts > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    finally:
        llm.shutdown()


def test_other_drafts_keep_the_output(models: dict[str, Path], reference: LLM) -> None:
    expected = _tokens(reference, PROMPTS, GREEDY)
    for name in ("near", "other"):
        llm = LLM(str(models["target"]), max_model_len=256,
                  speculative_config=_spec(models[name], method="draft_model"))
        try:
            assert _tokens(llm, PROMPTS, GREEDY) == expected, name
            stats = _stats(llm)
            assert stats.num_accepted_tokens < stats.num_draft_tokens, name
            if name == "near":  # partial acceptance: some guesses right, some wrong
                assert 0 < stats.num_accepted_tokens
                assert stats.num_accepted_tokens_per_pos[0] > stats.num_accepted_tokens_per_pos[-1]
        finally:
            llm.shutdown()


@pytest.fixture(scope="module")
def draft_llm(models: dict[str, Path]) -> LLM:
    """The near draft, with chunked prefill in chunks of 16 tokens."""
    llm = LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["near"]),
              enable_chunked_prefill=True, max_num_batched_tokens=16)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def same_llm(models: dict[str, Path]) -> LLM:
    llm = LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["target"]))
    yield llm
    llm.shutdown()


def test_chunked_prefill_and_prefix_hits(draft_llm: LLM, reference: LLM) -> None:
    long = [p + " " + p for p in PROMPTS]  # 30-70 tokens: several chunks of 16
    expected = _tokens(reference, long, GREEDY)
    assert _tokens(draft_llm, long, GREEDY) == expected
    # Half the prompt from the cache, the rest in chunks.
    assert _tokens(draft_llm, [p + " and more" for p in long], GREEDY) == _tokens(
        reference, [p + " and more" for p in long], GREEDY)
    stats = _stats(draft_llm)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


# The ngram tests' checks, here with drafts from a model.
@pytest.mark.parametrize("max_tokens", [1, 2, 4, 6, 9])
def test_max_tokens_inside_an_accepted_run(same_llm: LLM, reference: LLM, max_tokens: int) -> None:
    ngram_tests.test_max_tokens_inside_an_accepted_run(same_llm, reference, max_tokens)


def test_stops_inside_an_accepted_run(same_llm: LLM, reference: LLM) -> None:
    ngram_tests.test_stops_inside_an_accepted_run(same_llm, reference)


def test_mixed_batch_logprobs_and_sampling(draft_llm: LLM, reference: LLM) -> None:
    """Logprobs and penalties keep a request from speculating: it still runs in the draft's
    batches (its blocks may be hit later), and nothing changes for it."""
    ngram_tests.test_mixed_batch_some_requests_do_not_speculate(draft_llm, reference)
    # The prompt of the logprobs request, hit from the cache by a speculating one.
    assert _tokens(draft_llm, PROMPTS[1:2], GREEDY) == _tokens(reference, PROMPTS[1:2], GREEDY)
    sampled = SamplingParams(max_tokens=20, temperature=0.8, top_k=20, ignore_eos=True)
    assert all(len(t) == 20 for t in _tokens(draft_llm, PROMPTS, sampled))


def test_guesses_stop_at_max_model_len(same_llm: LLM, reference: LLM) -> None:
    # 240 prompt tokens of 256: the draft's guesses, and its scratch positions, end at the
    # model's length, and the output is plain decoding's up to it.
    prompt = {"prompt_token_ids": [11, 12, 13, 14, 15] * 48}
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    got = same_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    want = reference.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert list(got.token_ids) == list(want.token_ids) and len(got.token_ids) == 16


def test_preemption_with_a_tiny_kv_budget(models: dict[str, Path], reference: LLM) -> None:
    # 16 blocks of 16 tokens (max_model_len 256), target and draft caches together, plus
    # the draft's scratch; four requests of ~80 tokens need 20 blocks: some are preempted.
    probe = LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["near"]), max_num_seqs=4)
    runner = probe.llm_engine.engine_core.executor.worker.model_runner
    per_block, reserved = runner.bytes_per_block, runner.kv_reserved_bytes
    probe.shutdown()
    assert reserved > 0
    llm = LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["near"]), max_num_seqs=4,
              kv_cache_memory=16 * per_block + reserved)
    try:
        params = SamplingParams(max_tokens=70, temperature=0, ignore_eos=True)
        assert _tokens(llm, PROMPTS, params) == _tokens(reference, PROMPTS, params)
        assert llm.llm_engine.engine_core.make_stats().num_preemptions > 0
        assert _stats(llm).num_accepted_tokens > 0
    finally:
        llm.shutdown()
    # A budget the draft's scratch leaves too little of says so, with the bytes given.
    with pytest.raises(ValueError, match=f"budget \\({reserved + per_block} bytes, of which the draft model's "
                                         f"scratch blocks \\(max_num_seqs=4\\) take {reserved} bytes first"):
        LLM(str(models["target"]), max_model_len=256, speculative_config=_spec(models["near"]), max_num_seqs=4,
            kv_cache_memory=reserved + per_block)


class HiddenStateProposer(Proposer):
    """Prompt lookup that checks ``batch.hidden_states``: through the target's LM head,
    each row must give back the token the request sampled last (greedy requests)."""

    needs_hidden_states = True
    checked: ClassVar[list[bool]] = []

    def __init__(self, config: Any, *, target_model: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.target = target_model

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        hidden = batch.hidden_states
        assert hidden is not None and hidden.shape == (len(batch.request_ids), 64)
        top = self.target.compute_logits(hidden).argmax(dim=-1).tolist()
        last = [int(batch.token_ids[i, n - 1]) for i, n in enumerate(batch.num_tokens)]
        type(self).checked.extend(t == w for t, w in zip(top, last))
        return [propose_ngram(batch.token_ids[i, : int(n)], 1, 3, K).tolist() for i, n in enumerate(batch.num_tokens)]


def test_a_proposer_gets_the_target_hidden_states(models: dict[str, Path], reference: LLM) -> None:
    HiddenStateProposer.checked.clear()
    llm = LLM(str(models["target"]), max_model_len=256, speculative_config={
        "method": f"{__name__}:HiddenStateProposer", "num_speculative_tokens": K})
    try:
        assert _tokens(llm, PROMPTS, GREEDY) == _tokens(reference, PROMPTS, GREEDY)
        stats = _stats(llm)
        # Rows after a partly accepted verification are among them.
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    finally:
        llm.shutdown()
    assert len(HiddenStateProposer.checked) > 40 and all(HiddenStateProposer.checked)


def test_bad_drafts_are_refused_with_the_reason(models: dict[str, Path], tmp_path: Path) -> None:
    target = str(models["target"])
    with pytest.raises(ValueError, match="the draft 'model': .*nowhere' is not a local folder or file"):
        LLM(target, max_model_len=256, speculative_config=_spec(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="the draft 'model': .*empty is a folder but has no config.json"):
        LLM(target, max_model_len=256, speculative_config=_spec(tmp_path / "empty"))
    with pytest.raises(ValueError, match="draft_tensor_parallel_size"):
        LLM(target, max_model_len=256, speculative_config=_spec(models["near"], draft_tensor_parallel_size=2))
    wider = shutil.copytree(models["other"], tmp_path / "wider")
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    with pytest.raises(ValueError, match=r"vocabulary of 448 tokens and the target .* of 384"):
        LLM(target, max_model_len=256, speculative_config=_spec(wider))
    renamed = shutil.copytree(models["other"], tmp_path / "renamed")
    tok = json.loads((renamed / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    token = next(t for t, i in vocab.items() if i == 100)
    vocab["zzz-not-a-token"] = vocab.pop(token)
    (renamed / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="another tokenizer than the target.*id 100"):
        LLM(target, max_model_len=256, speculative_config=_spec(renamed))


@pytest.mark.slow
def test_default_model_with_itself_as_draft(smollm2_folder: Path) -> None:
    prompts = ["Repeat exactly: the quick brown fox jumps over the lazy dog. Repeated:", "1, 2, 3, 4, 5,"]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    plain = LLM(str(smollm2_folder), max_model_len=512)
    expected = _tokens(plain, prompts, params)
    plain.shutdown()
    llm = LLM(str(smollm2_folder), max_model_len=512, speculative_config=_spec(smollm2_folder))
    try:
        assert _tokens(llm, prompts, params) == expected
        stats = _stats(llm)
        assert stats.num_drafts > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_draft_model_through_the_server(models: dict[str, Path], reference: LLM, tmp_path: Path) -> None:
    """``forkless serve --speculative-config`` with a draft model, mp executor, the official
    client (streamed and not): the greedy text of plain decoding, and /metrics counts the
    drafts."""
    import httpx

    from tests.server.conftest import start_server, stop_and_check

    expected = [o.outputs[0].text for o in reference.generate(PROMPTS[:2], GREEDY, use_tqdm=False)]
    spec = json.dumps({"method": "draft_model", "model": str(models["near"]), "num_speculative_tokens": K})
    srv = start_server(models["target"], tmp_path, "--speculative-config", spec,
                       "--distributed-executor-backend", "mp")
    try:
        client = srv.client()
        name = client.models.list().data[0].id
        for prompt, want in zip(PROMPTS, expected):
            got = client.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0,
                                            extra_body={"ignore_eos": True})
            assert got.choices[0].text == want
            stream = client.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            assert "".join(c.choices[0].text for c in stream if c.choices) == want
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        counts = {name: float(m[1]) for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
                  if (m := re.search(rf"^forkless:spec_decode_{name}_total\{{[^}}]*\}} (\S+)$", metrics, re.M))}
        assert counts["num_drafts"] > 0 and 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]
