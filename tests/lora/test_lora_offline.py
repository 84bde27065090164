"""Offline LoRA: each adapter's greedy output equals transformers + peft, and mixed batches
(base + several adapters in one step) give every request what it gets alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from forkless import LLM, SamplingParams
from forkless.lora import LoRARequest
from tests.lora.conftest import ADAPTERS, ARCHS

PROMPTS = ["The quick brown fox", "Paris is the capital of", "Hello world! Streaming"]
MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _hf_greedy(base: Path, adapter: Path | None, prompt_ids: list[list[int]]) -> list[list[int]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    outs = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
            outs.append(y[0, len(ids):].tolist())
    return outs


@pytest.fixture(scope="module", params=ARCHS)
def arch_llm(request, lora_models):
    base, adapters = lora_models[request.param]
    llm = LLM(str(base), enable_lora=True, max_loras=4, max_lora_rank=32, max_model_len=128,
              max_num_seqs=16)
    loras = {name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())}
    yield request.param, base, adapters, llm, loras
    llm.shutdown()


def _ids(llm: LLM) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [tok.encode(p) for p in PROMPTS]


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_each_adapter_matches_peft(arch_llm):
    arch, base, adapters, llm, loras = arch_llm
    prompt_ids = _ids(llm)
    ours_base = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert ours_base == _hf_greedy(base, None, prompt_ids)
    for name in ADAPTERS:
        ours = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=loras[name]))
        ref = _hf_greedy(base, adapters[name], prompt_ids)
        assert ours == ref, f"{arch} adapter {name}"
        assert ours != ours_base, f"{arch} adapter {name} changed nothing: the test would prove nothing"


def test_mixed_batch_matches_alone(arch_llm):
    arch, base, adapters, llm, loras = arch_llm
    choices = [None, *loras.values()]
    alone = {}
    for lora in choices:
        alone[lora] = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=lora))
    # Every prompt under every adapter and the base model, interleaved, in one batch.
    prompts = [p for p in PROMPTS for _ in choices]
    per_prompt = [lora for _ in PROMPTS for lora in choices]
    mixed = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=per_prompt))
    for i, (tokens, lora) in enumerate(zip(mixed, per_prompt)):
        assert tokens == alone[lora][i // len(choices)], f"{arch} prompt {i} adapter {lora}"


# One architecture is enough: the cache key does not depend on it.
@pytest.mark.parametrize("arch_llm", ["llama"], indirect=True)
def test_prefix_cache_is_per_adapter(arch_llm):
    arch, base, adapters, llm, loras = arch_llm
    long_prompt = " ".join(PROMPTS * 4)  # several full 16-token blocks
    lora = loras["all-r8"]
    first = llm.generate(long_prompt, GREEDY, use_tqdm=False, lora_request=lora)[0]
    base_out = llm.generate(long_prompt, GREEDY, use_tqdm=False)[0]
    again = llm.generate(long_prompt, GREEDY, use_tqdm=False, lora_request=lora)[0]
    other = llm.generate(long_prompt, GREEDY, use_tqdm=False, lora_request=loras["qv-r16-rslora"])[0]
    assert again.num_cached_tokens >= 32  # the adapter's own blocks are reused...
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    # ...and never another adapter's or the base model's (cached before: 0 hits).
    prompt_ids = [llm.get_tokenizer().encode(long_prompt)]
    assert list(base_out.outputs[0].token_ids) == _hf_greedy(base, None, prompt_ids)[0]
    assert list(other.outputs[0].token_ids) == _hf_greedy(base, adapters["qv-r16-rslora"], prompt_ids)[0]
    assert other.num_cached_tokens == 0 and base_out.num_cached_tokens == 0
