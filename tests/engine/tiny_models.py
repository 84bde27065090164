"""Tiny random-weight models with a real (byte-level BPE) tokenizer, for engine tests."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Hello world! Streaming tokens one at a time is fun.",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve r\u00e9sum\u00e9, \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, emoji \U0001f600\U0001f680.",
    "Numbers 0123456789 and symbols !@#$%^&*() appear too.",
]
SPECIAL_TOKENS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 384

_TINY = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
    bos_token_id=0,
    eos_token_id=1,
)


def save_tokenizer(folder: Path) -> None:
    """Train a byte-level BPE tokenizer on :data:`CORPUS` and save it with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 16,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def make_model(folder: Path, arch: str = "llama", seed: int = 0, echo: bool = False) -> Path:
    """Save a tiny random model of ``arch`` (``llama`` or ``qwen3``) plus the tokenizer.

    ``echo``: a Llama whose layers add nothing to the residual stream (zero output and down
    projections) and whose LM head is its embedding, so greedy decoding repeats the
    prompt's last token: output that prompt lookup predicts, whatever the random weights.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(**_TINY, tie_word_embeddings=echo)
    elif arch == "qwen3" and not echo:
        config = Qwen3Config(**_TINY, head_dim=32, tie_word_embeddings=True)
    else:
        raise ValueError(arch)
    model = AutoModelForCausalLM.from_config(config).eval()
    if echo:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder
