"""Write tiny random Llama models as GGUF files, the way llama.cpp's converter does.

The reference for every GGUF test is a ``transformers`` Llama whose weights are the exact
values the GGUF holds (quantized then dequantized), in Hugging Face order. The GGUF copy is
written independently of forkless: its own name table, and llama.cpp's q/k permutation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import dequantize, quantize
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config, Qwen3Config
from transformers.convert_slow_tokenizer import bytes_to_unicode

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("o", "n")]

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
ROPE_THETA, RMS_EPS = 500000.0, 1e-6

_HF_TO_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


@dataclass
class TinyGGUF:
    """A GGUF file and the Hugging Face model it must convert back into."""

    path: Path
    reference: PreTrainedModel
    # The q_proj weight of layer 0, as stored in the file (llama.cpp order) and in HF order.
    stored_q: np.ndarray
    reference_q: np.ndarray


def vocabulary() -> list[str]:
    """Byte-level BPE tokens: 256 byte symbols, the merged tokens, then the special tokens."""
    return list(bytes_to_unicode().values()) + ["".join(m) for m in MERGES] + SPECIAL_TOKENS


def llamacpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py ``LlamaModel.permute``, verbatim."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _gguf_name(hf_name: str) -> str:
    base, suffix = hf_name.rsplit(".", 1)
    if base in _HF_TO_GGUF_GLOBAL:
        return f"{_HF_TO_GGUF_GLOBAL[base]}.{suffix}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF_BLOCK[rest]}.{suffix}"


def _round_trip(weights: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray]:
    """(what the file stores, what it dequantizes to)."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return weights, weights
    if qtype == gguf.GGMLQuantizationType.F16:
        stored = weights.astype(np.float16)
        return stored, stored.astype(np.float32)
    stored = quantize(weights, qtype)
    return stored, dequantize(stored, qtype).reshape(weights.shape)


_CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def write_tiny_llama_gguf(
    path: Path,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q4_1,
    tie_word_embeddings: bool = True,
    architecture: str = "llama",
    seed: int = 0,
    model_type: str = "llama",
) -> TinyGGUF:
    """Write a 2-layer random Llama-family model as GGUF and return its HF reference.

    Args:
        path: Where to write the ``.gguf`` file.
        qtype: Type of every 2-D weight; norms and biases stay F32, as in llama.cpp.
        tie_word_embeddings: When False the file carries a separate ``output.weight``.
        architecture: ``general.architecture`` to declare (to test unsupported ones).
        seed: Seed of the random weights.
        model_type: ``llama``, ``qwen2`` (q/k/v biases) or ``qwen3`` (q/k norms).

    Returns:
        The file, the reference model and layer 0's q_proj in both orders.
    """
    torch.manual_seed(seed)
    tokens = vocabulary()
    config = _CONFIGS[model_type](
        head_dim=HIDDEN // HEADS, vocab_size=len(tokens), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=256, rms_norm_eps=RMS_EPS, rope_theta=ROPE_THETA,
        tie_word_embeddings=tie_word_embeddings, bos_token_id=1 + 256 + len(MERGES),
        eos_token_id=2 + 256 + len(MERGES),
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    state = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    if tie_word_embeddings:
        state.pop("lm_head.weight", None)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_key_length(HIDDEN // HEADS)
    writer.add_value_length(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL
                            for t in tokens])
    writer.add_token_merges([" ".join(m) for m in MERGES])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    reference: dict[str, torch.Tensor] = {}
    rng = np.random.default_rng(seed)
    for name, weights in state.items():
        if weights.ndim == 1:
            # Random norms and biases, so that one written to the wrong place changes the logits.
            weights = (1.0 + 0.1 * rng.standard_normal(weights.shape)).astype(np.float32)
            stored, restored = weights, weights
        else:
            stored, restored = _round_trip(weights, qtype)
            # Row permutation commutes with row-wise block quantization, so the stored
            # tensor is exactly the llama.cpp-permuted version of the quantized weights.
            if model_type == "llama" and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
                heads = HEADS if "q_proj" in name else KV_HEADS
                stored = llamacpp_permute(stored, heads)
        if stored.dtype == np.uint8:
            writer.add_tensor(_gguf_name(name), stored, raw_dtype=qtype)
        else:
            writer.add_tensor(_gguf_name(name), stored)
        reference[name] = torch.from_numpy(np.ascontiguousarray(restored))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    model.load_state_dict(reference, strict=False)
    if tie_word_embeddings:
        model.tie_weights()
    q_name = "model.layers.0.self_attn.q_proj.weight"
    stored_q = reference[q_name].numpy()
    if model_type == "llama":
        stored_q = llamacpp_permute(stored_q, HEADS)
    return TinyGGUF(path, model, stored_q, reference[q_name].numpy())


def int8_route_reference(x: torch.Tensor, stored: np.ndarray, qtype: str, in_features: int) -> torch.Tensor:
    """``x w^T`` as the GGUF kernels' int8 route defines it, written from its definition.

    Each block of 32 of a row of ``x`` is rounded to int8 with the scale ``max |x| / 127``
    (ties to even), giving ``x_hat``. Q8_0: ``x_hat . w``. Q4_1 (``w = d * q + m``): the
    weights centred on ``c = m + 8 d`` meet ``x_hat`` and ``c`` meets the block's exact sum,
    ``(w - c) . x_hat + c * sum(x)``.
    """
    t = gguf.GGMLQuantizationType[qtype]
    n, k, nb = stored.shape[0], in_features, in_features // 32
    w = torch.from_numpy(dequantize(stored, t).reshape(n, nb, 32).copy())
    xb = x.float().reshape(-1, nb, 32)
    a = xb.abs().amax(-1, keepdim=True)
    # A true division (a Python number over a tensor is a reciprocal times it in torch, which
    # moves exact ties of x * inv, as in x = 81.5 / 127 * max|x|, to the other side).
    inv = torch.where(a > 0, torch.full_like(a, 127.0) / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(a))
    x_hat = torch.round(xb * inv) * (a / 127.0)
    if qtype == "Q8_0":
        return torch.einsum("rbi,nbi->rn", x_hat, w)
    blocks = torch.from_numpy(np.ascontiguousarray(stored).view(np.uint8).reshape(n, nb, 20).copy())
    d, m = (blocks[..., i:i + 2].contiguous().view(torch.float16).float().view(n, nb) for i in (0, 2))
    c = m + 8 * d
    return torch.einsum("rbi,nbi->rn", x_hat, w - c[..., None]) + xb.sum(-1) @ c.T
