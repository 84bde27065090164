"""LoRA split across workers (two gloo worker processes). Under tensor parallelism (``-tp 2``)
each rank applies its part of every adapter (B's rows of a column-parallel projection, A's
columns of a row-parallel one, summed by the layer's all-reduce); under pipeline parallelism
(``-pp 2``) each stage applies the adapter's modules of its own layers. Either way a mixed
batch of the base model and three adapters gives, per request, the tokens of one worker --
on Llama (2 KV heads, one per rank) and Qwen2 (1 KV head, replicated on both ranks, with its
k/v adapter rows)."""

from __future__ import annotations

import pytest

from forkless import LLM, SamplingParams
from forkless.lora import LoRARequest

PROMPTS = ["The quick brown fox", "Paris is the capital of", "Hello world! Streaming", "Numbers 0123"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)


def _mixed(base, adapters: dict, tp: int, pp: int = 1) -> list:
    llm = LLM(str(base), enable_lora=True, max_loras=4, max_lora_rank=32, max_model_len=128, max_num_seqs=16,
              tensor_parallel_size=tp, pipeline_parallel_size=pp, kv_cache_memory=16 << 20)
    try:
        loras = [None] + [LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())]
        return [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY, lora_request=loras, use_tqdm=False)]
    finally:
        llm.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "tp", "pp"), [("llama", 2, 1), ("qwen2", 2, 1), ("llama", 1, 2)])
def test_adapters_on_two_ranks_give_the_tokens_of_one(lora_models, arch: str, tp: int, pp: int) -> None:
    from tests.lora.conftest import make_base

    base, adapters = lora_models[arch]
    if arch == "qwen2":  # one KV head: both ranks hold it, and the whole of k/v's adapter rows
        base = make_base(base.parent / "base-1kv", "qwen2", num_key_value_heads=1)
        from tests.lora.conftest import ADAPTERS, make_adapter

        adapters = {name: make_adapter(base, base.parent / f"{name}-1kv", *spec, seed=i + 1)
                    for i, (name, spec) in enumerate(ADAPTERS.items())}
    one, two = _mixed(base, adapters, 1), _mixed(base, adapters, tp, pp)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert len({tuple(o.token_ids) for o in one}) == len(PROMPTS)  # the adapters change the text
    for a, b in zip(one, two):
        for lp_a, lp_b in zip(a.logprobs, b.logprobs):
            for tok in lp_a:
                assert lp_a[tok].logprob == pytest.approx(lp_b[tok].logprob, abs=1e-4)
