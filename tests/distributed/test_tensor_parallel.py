"""Tensor parallelism (``-tp 2``) on the CPU: two gloo worker processes give the same greedy
tokens as one worker, on Llama (untied head, odd vocabulary, async scheduling), Qwen2 (one
KV head replicated on both ranks, q/k/v biases, tied head) and Qwen3 (q/k norms, odd
vocabulary); each rank holds and reads half of the weights; bad sizes are refused up front.
Pipeline parallelism likewise: ``-pp 2`` (Llama) and ``-tp 2 -pp 2`` (Qwen2, four
processes, its tied head copied to the last stage, async scheduling); and ``-tp 2`` on the
``torch`` attention backend as on the default ``cpu`` one (Qwen3).

One engine per architecture and size, shared by the tests of this module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from forkless import LLM, SamplingParams
from forkless.config import EngineArgs
from tests.distributed.conftest import PROMPTS

ARCHS = ("llama", "qwen2", "qwen3")
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=3)


def _run(model: Path, tp: int, pp: int = 1, seeded: list | None = None, **kwargs) -> list:
    """Greedy completions of PROMPTS; with ``seeded``, seeded random samples appended to it."""
    llm = LLM(model=str(model), tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=128,
              kv_cache_memory=16 << 20, **kwargs)
    try:
        if seeded is not None:
            params = [SamplingParams(max_tokens=16, temperature=1.0, seed=i, ignore_eos=True) for i in range(4)]
            seeded += [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
        return [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.shutdown()  # the workers exit before the next engine starts (two cores)


@pytest.fixture(scope="module")
def outputs(tp_models: dict[str, Path]) -> dict[tuple[str, int], list]:
    """Completions of every architecture with one worker and with two (computed once)."""
    out: dict[tuple[str, int], list] = {}
    for arch in ARCHS:
        seeded: dict[int, list] = {1: [], 2: []}
        out[arch, 1] = _run(tp_models[arch], 1, seeded=seeded[1] if arch == "llama" else None)
        # The llama engine also checks async scheduling with two ranks.
        out[arch, 2] = _run(tp_models[arch], 2, seeded=seeded[2] if arch == "llama" else None,
                            async_scheduling=arch == "llama")
        if arch == "llama":
            out["seeded"] = seeded
    out["llama", "pp2"] = _run(tp_models["llama"], 1, pp=2)
    # The other CPU attention backend (torch's SDPA over the gathered cache) splits alike.
    out["qwen3", "tp2-torch"] = _run(tp_models["qwen3"], 2, attention_backend="torch")
    out["qwen2", "tp2pp2"] = _run(tp_models["qwen2"], 2, pp=2, async_scheduling=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "split"), [(a, 2) for a in ARCHS] + [("llama", "pp2"), ("qwen2", "tp2pp2"),
                                                                     ("qwen3", "tp2-torch")])
def test_split_ranks_give_the_same_greedy_tokens_as_one(outputs: dict, arch: str, split) -> None:
    one, two = outputs[arch, 1], outputs[arch, split]
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert len({tuple(o.token_ids) for o in one}) > 1  # the prompts lead to different text
    for a, b in zip(one, two):  # the logits match too, not only their argmax
        for lp_a, lp_b in zip(a.logprobs, b.logprobs):
            assert lp_a.keys() == lp_b.keys()
            for tok in lp_a:
                assert lp_a[tok].logprob == pytest.approx(lp_b[tok].logprob, abs=1e-4)


def _load_rank(model: Path, rank: int, tp: int, monkeypatch: pytest.MonkeyPatch, pp: int = 1):
    """The model as TP rank ``rank`` of ``tp`` (or stage ``rank`` of ``pp``) builds and loads
    it (no collective runs while loading, so the group needs no peers here)."""
    from forkless.distributed import parallel_state as ps
    from forkless.model_loader import load_model

    with monkeypatch.context() as m:
        m.setattr(ps, "_TP", ps.GroupCoordinator(list(range(tp)), rank, name="tp") if tp > 1 else None)
        m.setattr(ps, "_PP", ps.GroupCoordinator(list(range(pp)), rank, name="pp") if pp > 1 else None)
        return load_model(model, None, "float32", "cpu", "torch")


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_each_rank_holds_and_reads_half_of_the_weights(tp_models: dict[str, Path], arch: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless.model_loader.weights import iterate_weights

    model_dir = tp_models[arch]
    full = _load_rank(model_dir, 0, 1, monkeypatch)
    ranks = [_load_rank(model_dir, r, 2, monkeypatch) for r in range(2)]
    # Norms are replicated (a few hundred floats) and the vocabulary may gain a padding row;
    # with one KV head both ranks hold it (its k/v rows: 2 of 6 head-widths of qkv_proj).
    replicated = sum(p.numel() * 4 for n, p in full.named_parameters() if "norm" in n)
    if full.num_kv_heads == 1:
        replicated += sum(p.numel() * 4 // 6 for n, p in full.named_parameters() if "qkv_proj" in n)
    row = full.config.hidden_size * 4
    for model in ranks:
        assert _weight_bytes(model) <= _weight_bytes(full) / 2 + replicated + row
        assert model.num_kv_heads == max(1, full.num_kv_heads // 2)
        # What the loader reads for this rank: its slices, never the whole checkpoint.
        read = sum(t.numel() * 4 for _, t in iterate_weights(model_dir, torch.float32, shard=model.weight_shard))
        whole = sum(t.numel() * 4 for _, t in iterate_weights(model_dir, torch.float32))
        assert read <= whole / 2 + replicated + row, (read, whole)
    # The ranks' pieces put back together are the unsplit weights.
    attn = [m.model.layers[0].self_attn for m in (full, *ranks)]
    q = full.config.num_attention_heads * full.head_dim
    torch.testing.assert_close(torch.cat([a.qkv_proj.weight[: q // 2] for a in attn[1:]]),
                               attn[0].qkv_proj.weight[:q])
    torch.testing.assert_close(torch.cat([a.o_proj.weight for a in attn[1:]], dim=1), attn[0].o_proj.weight)
    emb = torch.cat([m.model.embed_tokens.weight for m in ranks])
    torch.testing.assert_close(emb[: full.config.vocab_size], full.model.embed_tokens.weight)
    assert not emb[full.config.vocab_size:].any()  # the padding rows are zeros
    if full.config.num_key_value_heads == 1:  # the one KV head, replicated on both ranks
        kv = attn[0].qkv_proj.weight[q:]
        for a in attn[1:]:
            torch.testing.assert_close(a.qkv_proj.weight[q // 2:], kv)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(tensor_parallel_size=3), "--tensor-parallel-size=3 is invalid: expected a size the model's "
                                   "num_attention_heads (4) splits into evenly: one of 1, 2, 4"),
    (dict(tensor_parallel_size=0), "--tensor-parallel-size=0 is invalid: expected a positive integer"),
    (dict(pipeline_parallel_size=3), "--pipeline-parallel-size=3 is invalid: expected at most the model's "
                                     "num_hidden_layers (2)"),
    (dict(pipeline_parallel_size=2, speculative_config={"method": "draft_model", "model": "/nonexistent",
                                                        "num_speculative_tokens": 2}),
     "--speculative-config (other than method ngram) does not work with --pipeline-parallel-size"),
    (dict(tensor_parallel_size=2, speculative_config={"method": "mypkg.proposer:Mine", "num_speculative_tokens": 2}),
     "--speculative-config method 'mypkg.proposer:Mine' does not work with --tensor-parallel-size > 1 yet"),
])
def test_bad_sizes_and_combinations_fail_before_any_process(tp_models: dict[str, Path], kwargs: dict,
                                                            message: str) -> None:
    with pytest.raises(ValueError) as info:
        EngineArgs(model=str(tp_models["llama"]), **kwargs).create_engine_config()
    assert message in str(info.value)


def test_a_platform_that_gathers_logits_to_one_rank_is_refused(tp_models: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's Platform.use_all_gather(): a platform ported from vLLM that says False is told,
    # not silently given all-gathered logits.
    from forkless.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "use_all_gather", classmethod(lambda cls: False))
    with pytest.raises(ValueError, match=r"use_all_gather\(\) is False"):
        EngineArgs(model=str(tp_models["llama"]), tensor_parallel_size=2).create_engine_config()
    EngineArgs(model=str(tp_models["llama"])).create_engine_config()  # one rank gathers nothing


def test_more_ranks_than_kv_heads_must_be_a_multiple(tp_models: dict[str, Path]) -> None:
    # Qwen2 here: 4 query heads, 1 KV head: 2 and 4 ranks work (the KV head is copied).
    config = EngineArgs(model=str(tp_models["qwen2"]), tensor_parallel_size=4).create_engine_config()
    assert config.parallel_config.world_size == 4
    assert config.parallel_config.distributed_executor_backend == "mp"  # uni runs one worker


@pytest.mark.slow
def test_a_gguf_file_runs_split_like_one_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The GGUF is converted once into a safetensors folder (in this process), and each rank
    # then reads its slices of that folder.
    from tests.model_loader.tiny_gguf import write_tiny_llama_gguf

    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(tmp_path / "cache"))  # the workers inherit it
    gguf_file = write_tiny_llama_gguf(tmp_path / "m.gguf", architecture="qwen2", model_type="qwen2").path
    one, two = _run(gguf_file, 1), _run(gguf_file, 2)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in two)


def test_a_model_class_without_tensor_parallel_support_is_refused(tp_models: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A plugin's model class declares supports_tensor_parallel (default False): one that
    # does not is refused before it is built, rather than run unsplit on every rank.
    from forkless.models.llama import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "supports_tensor_parallel", False)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM .* does not support tensor parallelism .* "
                                         r"--tensor-parallel-size 1, not 2"):
        _load_rank(tp_models["llama"], 0, 2, monkeypatch)


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_each_stage_holds_and_reads_only_its_layers(tp_models: dict[str, Path], arch: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless.model_loader.weights import iterate_weights

    model_dir = tp_models[arch]
    full = _load_rank(model_dir, 0, 1, monkeypatch)
    stages = [_load_rank(model_dir, r, 1, monkeypatch, pp=2) for r in range(2)]
    names = [set(dict(m.named_parameters())) for m in stages]
    assert all(n.startswith(("model.embed_tokens.", "model.layers.0.")) for n in names[0])
    assert all(n.startswith(("model.layers.1.", "model.norm.", "lm_head.")) for n in names[1])
    assert [m.num_layers for m in stages] == [1, 1]  # each caches its own layer's KV only
    # Every weight of the model is on one stage, with the same values; a tied head is the
    # last stage's copy of the embedding.
    params = dict(full.named_parameters())
    for model in stages:
        for name, param in model.named_parameters():
            expected = params.get(name, params["model.embed_tokens.weight"] if name == "lm_head.weight" else None)
            torch.testing.assert_close(param, expected)
    assert set(params) - {"lm_head.weight"} <= names[0] | names[1]
    for model in stages:
        read = {n for n, t in iterate_weights(model_dir, torch.float32, shard=model.weight_shard) if t.numel()}
        assert read and all(model._stage_name(n) is not None for n in read), read  # nothing of the other stage


@pytest.mark.slow
def test_seeded_sampling_is_the_same_on_two_ranks(outputs: dict) -> None:
    # Every rank samples from the same gathered logits with the same generators; under async
    # scheduling each feeds its own sampled tokens to the next step, so they must agree.
    one, two = outputs["seeded"][1], outputs["seeded"][2]
    assert len(one) == 4 and two == one
    assert len({tuple(t) for t in one}) == 4


def _speculate(model: Path, spec: dict) -> tuple[list[list[int]], object]:
    """Greedy tokens of PROMPTS on two ranks with ``spec``, and the drafts' counters. (No
    logprobs: a request that asks for them does not speculate.)"""
    llm = LLM(model=str(model), tensor_parallel_size=2, max_model_len=128, kv_cache_memory=16 << 20,
              speculative_config=spec)
    try:
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
        return got, llm.llm_engine.engine_core.make_stats().spec_decode
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_a_draft_model_on_two_ranks_keeps_greedy_tokens(tp_models: dict[str, Path], outputs: dict) -> None:
    # The draft (here the target itself: every guess is kept) runs whole on both ranks.
    spec = {"method": "draft_model", "model": str(tp_models["llama"]), "num_speculative_tokens": 3}
    got, stats = _speculate(tp_models["llama"], spec)
    assert got == [list(o.token_ids) for o in outputs["llama", 1]]
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


@pytest.mark.slow
def test_ngram_speculation_on_two_ranks_keeps_greedy_tokens(tp_models: dict[str, Path], outputs: dict) -> None:
    # ngram drafts from each request's own tokens: every rank proposes and verifies alike.
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    got, stats = _speculate(tp_models["llama"], spec)
    assert got == [list(o.token_ids) for o in outputs["llama", 1]]
    assert stats.num_draft_tokens > 0
