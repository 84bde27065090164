"""forkless models against Hugging Face transformers on tiny random checkpoints (float32).

Each model runs, with the reference attention and linear layers and with the CPU kernels,
over the paged cache (block_size 4, shuffled block ids) the way the engine
drives it: flattened multi-sequence prefill, batched decode, chunked prefill mixed with
decode, and padded batches. Every logit row must match transformers' full-sequence
forward at the same position.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from forkless import cpu_kernels
from forkless.attention import get_attention_backend
from forkless.model_loader import load_model
from forkless.models.hf_config import get_rope_parameters
from forkless.models.layers.cpu_linear import PackedLinear
from forkless.models.layers.rotary import RotaryEmbedding
from paged_harness import PagedHarness

ATOL = 2e-5

_TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    # Large enough that attention is far from uniform, so position errors show.
    initializer_range=0.2,
)

CONFIGS = {
    "llama": lambda: LlamaConfig(**_TINY, tie_word_embeddings=False),
    "llama_tied_mqa_bias": lambda: LlamaConfig(
        **{**_TINY, "num_key_value_heads": 1},
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
    ),
    "llama3_rope": lambda: LlamaConfig(
        **_TINY,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "llama_linear_rope": lambda: LlamaConfig(**_TINY, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "qwen2_tied": lambda: Qwen2Config(**_TINY, tie_word_embeddings=True),
    "qwen3_head_dim": lambda: Qwen3Config(**_TINY, head_dim=32, tie_word_embeddings=False),
    "qwen3_tied": lambda: Qwen3Config(**_TINY, tie_word_embeddings=True),
}


# "torch": the reference attention backend, nn.Linear layers and plain PyTorch layer ops.
# "cpu": what a CPU worker runs, the C kernels for decode attention, the linear layers on
# packed weights and the fused layer ops.
VARIANTS = ("torch", "cpu")


@pytest.fixture(scope="module", params=[(c, v) for c in sorted(CONFIGS) for v in VARIANTS],
                ids=lambda p: "-".join(p))
def models(request, tmp_path_factory):
    config, variant = request.param
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(CONFIGS[config]()).eval()
    folder = tmp_path_factory.mktemp(config)
    hf_model.save_pretrained(folder)
    backend = get_attention_backend(variant)
    with pytest.MonkeyPatch.context() as mp:
        # Read when the layer ops are built: they pick their implementation then.
        mp.setenv("FORKLESS_FUSED_KERNELS", "1" if variant == "cpu" else "0")
        model = load_model(folder, AutoConfig.from_pretrained(folder), torch.float32, "cpu", backend)
    if variant == "cpu":
        assert cpu_kernels.load() is not None, "the CPU kernels did not build (see the log)"
        model.use_cpu_kernels()
    yield hf_model, model, backend


@torch.inference_mode()
def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    return hf_model(torch.tensor([tokens])).logits[0].float()


def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]


def test_tied_embeddings_share_storage(models):
    hf_model, model, _ = models
    if isinstance(model.lm_head, PackedLinear):  # its own packed copy, whether tied or not
        torch.testing.assert_close(model.lm_head.weight, hf_model.lm_head.weight, rtol=0, atol=0)
        return
    tied = model.config.tie_word_embeddings
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == tied
    torch.testing.assert_close(model.lm_head.weight, hf_model.lm_head.weight, rtol=0, atol=0)


def test_batched_prefill_then_decode(models):
    hf_model, model, backend = models
    harness = PagedHarness(model, backend, block_size=4)
    seqs = prompts(1, [5, 11, 8])
    out = harness.step([(f"s{i}", p) for i, p in enumerate(seqs)])
    for p, logits in zip(seqs, out):
        torch.testing.assert_close(logits, hf_logits(hf_model, p), rtol=0, atol=ATOL)

    # Greedy continuation, so the test follows what the model itself would generate.
    for _ in range(6):
        nxt = [[int(out[i][-1].argmax())] for i in range(len(seqs))]
        out = harness.step([(f"s{i}", t) for i, t in enumerate(nxt)])
        for i, t in enumerate(nxt):
            seqs[i] = seqs[i] + t
            torch.testing.assert_close(out[i][0], hf_logits(hf_model, seqs[i])[-1], rtol=0, atol=ATOL)


def test_chunked_prefill_mixed_with_decode(models):
    hf_model, model, backend = models
    harness = PagedHarness(model, backend, block_size=4, seed=3)
    long, short = prompts(2, [13, 6])
    ref_long = hf_logits(hf_model, long)

    # Step 1: first chunk of the long prompt (ending mid-block) + the short prompt.
    first, second = harness.step([("long", long[:7]), ("short", short)])
    torch.testing.assert_close(first, ref_long[:7], rtol=0, atol=ATOL)
    torch.testing.assert_close(second, hf_logits(hf_model, short), rtol=0, atol=ATOL)

    # Step 2: the rest of the long prompt over its cached first chunk, while the short
    # one decodes in the same batch; padded rows at the end must be ignored.
    tok = int(second[-1].argmax())
    first, second = harness.step([("short", [tok]), ("long", long[7:])], pad_tokens=3)
    torch.testing.assert_close(first[0], hf_logits(hf_model, short + [tok])[-1], rtol=0, atol=ATOL)
    torch.testing.assert_close(second, ref_long[7:], rtol=0, atol=ATOL)


def test_inv_freq_matches_hf(models):
    hf_model, model, _ = models
    ours = model.model.layers[0].self_attn.rotary_emb.inv_freq
    torch.testing.assert_close(ours, hf_model.model.rotary_emb.inv_freq.float(), rtol=1e-6, atol=0)
    if get_rope_parameters(model.config)["rope_type"] != "default":
        theta = get_rope_parameters(model.config)["rope_theta"]
        unscaled = RotaryEmbedding(ours.numel() * 2, {"rope_type": "default", "rope_theta": theta})
        assert not torch.allclose(ours, unscaled.inv_freq)


def test_rotary_matters(models, monkeypatch):
    """Guards the comparison itself: with rotary embeddings disabled, logits differ."""
    hf_model, model, backend = models
    for rope in (m for m in model.modules() if isinstance(m, RotaryEmbedding)):
        monkeypatch.setattr(rope, "forward", lambda positions, q, k: (q, k))
    (seq,) = prompts(4, [12])
    (logits,) = PagedHarness(model, backend).step([("s", seq)])
    assert (logits - hf_logits(hf_model, seq)).abs().max() > 100 * ATOL
