"""A decode step through all decoder layers in one C call, float32 or bfloat16
(forkless.models.layers.cpu_decode_stack): the same logits as the layers run one module at
a time, bit for bit, and the modules wherever the stack would not give them."""

from __future__ import annotations

import pytest
import torch
from paged_harness import PagedHarness
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from forkless.attention import get_attention_backend
from forkless.model_loader import load_model
from forkless.models.layers.cpu_decode_stack import CpuDecodeStack
from forkless.models.layers.cpu_linear import OneDNNLinear, PackedLinearBF16, onednn_bf16_available

_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
CONFIGS = {
    # hidden 64 and intermediate 176 are not whole panels (48 or 24 columns): padded outputs.
    "llama_bias_tied": lambda: LlamaConfig(**_TINY, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "qwen2": lambda: Qwen2Config(**_TINY, tie_word_embeddings=False),
    "qwen3_qk_norm": lambda: Qwen3Config(**_TINY, head_dim=32, tie_word_embeddings=True),
    "llama_mqa_partial_rope": lambda: LlamaConfig(**{**_TINY, "num_key_value_heads": 1}, partial_rotary_factor=0.5),
}


# The CPU platform's op implementations (also on a GPU host), kernels loaded.
pytestmark = pytest.mark.usefixtures("ops_on_cpu")


def _load(folder, dtype: torch.dtype = torch.float32, **env: str):
    with pytest.MonkeyPatch.context() as mp:
        if dtype == torch.bfloat16:
            # forkless's bfloat16 kernel on any CPU (its plain loops without AVX512-BF16).
            mp.setenv("FORKLESS_CPU_BF16_LINEAR", "kernels")
        for name, value in env.items():
            mp.setenv(name, value)
        model = load_model(folder, AutoConfig.from_pretrained(folder), dtype, "cpu", get_attention_backend("cpu"))
        model.use_cpu_kernels()
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def folder(request, tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(request.param)
    AutoModelForCausalLM.from_config(CONFIGS[request.param]()).save_pretrained(path)
    return path


class _Count:
    """Wraps a model's stack: how many steps it took (returned hidden states) and declined."""

    def __init__(self, model) -> None:
        self.taken = self.declined = 0
        stack = model.model.cpu_decode_stack
        forward = stack.forward

        def counted(*args):
            out = forward(*args)
            if out is None:
                self.declined += 1
            else:
                self.taken += 1
            return out

        stack.forward = counted


def _run(model, steps: int = 6, pad_tokens: int = 0) -> list[torch.Tensor]:
    """Three prompts prefilled together, then greedy decode steps; one sequence stops after
    two of them, so the batch shrinks. Returns every step's logits."""
    harness = PagedHarness(model, get_attention_backend("cpu"), block_size=4, seed=1)
    gen = torch.Generator().manual_seed(2)
    seqs = {f"s{i}": torch.randint(0, 256, (n,), generator=gen).tolist() for i, n in enumerate([5, 19, 9])}
    out = harness.step(list(seqs.items()))
    logits = list(out)
    live = list(seqs)
    for step in range(steps):
        if step == 2:
            out = out[1:]
            live = live[1:]
        nxt = [[int(o[-1].argmax())] for o in out]
        out = harness.step(list(zip(live, nxt)), pad_tokens=pad_tokens)
        logits += out
    return logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_match_the_modules_bit_for_bit(folder, dtype):
    model, reference = _load(folder, dtype), _load(folder, dtype, FORKLESS_CPU_DECODE_STACK="0")
    assert isinstance(model.model.cpu_decode_stack, CpuDecodeStack)
    if dtype == torch.bfloat16:
        assert isinstance(model.model.layers[0].mlp.down_proj, PackedLinearBF16)
    assert reference.model.cpu_decode_stack is None
    count = _Count(model)
    got, want = _run(model), _run(reference)
    # The prefill ran the modules (and bound the ops); every decode step ran the stack.
    assert (count.declined, count.taken) == (1, 6)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_padded_steps_run_the_modules(folder):
    """Rows with no slot (a padded batch) are not decodes: the step is the modules'."""
    model, reference = _load(folder), _load(folder, FORKLESS_CPU_DECODE_STACK="0")
    count = _Count(model)
    for g, w in zip(_run(model, steps=3, pad_tokens=2), _run(reference, steps=3, pad_tokens=2)):
        assert torch.equal(g, w)
    assert count.taken == 0


def test_an_op_not_on_its_kernel_keeps_the_modules(folder):
    """An op turned off (FORKLESS_CUSTOM_OPS) runs as itself, so every step is the modules'."""
    model = _load(folder, FORKLESS_CUSTOM_OPS="-silu_and_mul")
    count = _Count(model)
    _run(model, steps=2)
    assert count.taken == 0 and count.declined == 3


def test_a_hooked_attention_layer_keeps_the_modules(folder):
    """A KV connector hooks each attention backend's forward: the hook must still run."""
    from forkless.worker.kv_connector import _hook

    class Recorder:
        def __init__(self) -> None:
            self.saved: list[str] = []

        def has_connector_metadata(self) -> bool:
            return True

        def wait_for_layer_load(self, name: str) -> None:
            pass

        def save_kv_layer(self, name: str, kv_layer, attn_metadata) -> None:
            self.saved.append(name)

    model = _load(folder)
    recorder = Recorder()
    layer = model.model.layers[1].self_attn.attn
    _hook(layer, "model.layers.1.self_attn.attn", recorder)
    count = _Count(model)
    _run(model, steps=2)
    assert count.taken == 0
    assert len(recorder.saved) == 3  # the prefill and both decode steps


def test_lora_onednn_and_other_dtypes_get_no_stack(tmp_path, folder):
    """A wrapped projection (as a LoRA layer wraps one) never runs the stack, nor a bfloat16
    model on oneDNN's layers; a float16 model never gets one."""
    model = _load(folder)
    inner = model.model.layers[0].mlp.down_proj

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = inner

        def forward(self, x):
            return self.base(x)

    model.model.layers[0].mlp.down_proj = Wrapped()
    count = _Count(model)
    _run(model, steps=2)
    assert count.taken == 0
    if onednn_bf16_available():  # oneDNN's bfloat16 (AVX512-BF16 / AMX CPUs)
        onednn = _load(folder, torch.bfloat16, FORKLESS_CPU_BF16_LINEAR="onednn")
        assert isinstance(onednn.model.layers[0].mlp.down_proj, OneDNNLinear)
        count = _Count(onednn)
        _run(onednn, steps=2)
        assert count.taken == 0 and count.declined == 3
    fp16 = load_model(folder, AutoConfig.from_pretrained(folder), torch.float16, "cpu", get_attention_backend("cpu"))
    assert not CpuDecodeStack.applies_to(fp16.model)
