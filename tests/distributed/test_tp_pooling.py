"""Pooling models under tensor parallelism (``-tp 2``, two gloo worker processes): the real
all-MiniLM-L6-v2 encoder (12 heads and its intermediate layer split across the ranks, the
output projections' partial products all-reduced) embeds as with one worker and as
sentence-transformers; a BERT classifier and a causal sequence classifier (its decoder
split, its score head replicated) classify as with one worker; each rank reads half of
the encoder's layer weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from forkless import LLM
from tests.pooling.conftest import make_tiny_bert, minilm_folder, mixed_sentences

TEXTS = mixed_sentences(12, seed=3, max_words=60)


def _pool(model: Path, tp: int, task: str) -> np.ndarray:
    """Every text's embedding (``task`` "embed") or class probabilities ("classify")."""
    llm = LLM(str(model), dtype="float32", tensor_parallel_size=tp, kv_cache_memory=16 << 20)
    try:
        outs = getattr(llm, task)(TEXTS, use_tqdm=False)
        return np.stack([o.outputs.embedding if task == "embed" else o.outputs.probs for o in outs])
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_minilm_embeds_on_two_ranks_as_on_one_and_as_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer

    minilm = minilm_folder()
    one, two = _pool(minilm, 1, "embed"), _pool(minilm, 2, "embed")
    assert np.abs(two - one).max() < 1e-5
    reference = SentenceTransformer(str(minilm), device="cpu").encode(TEXTS, convert_to_numpy=True)
    cosine = (two * reference).sum(-1) / np.linalg.norm(two, axis=-1) / np.linalg.norm(reference, axis=-1)
    assert cosine.min() >= 0.9999


@pytest.mark.slow
def test_bert_and_causal_classifiers_on_two_ranks_classify_as_on_one(tmp_path: Path, tiny_llama: Path) -> None:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    bert = make_tiny_bert(tmp_path / "bert", minilm_folder(), num_labels=3)
    llama = tmp_path / "llama-cls"
    llama.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_llama / name).exists():
            shutil.copy(tiny_llama / name, llama / name)
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    LlamaForSequenceClassification(LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=4, pad_token_id=0, tie_word_embeddings=False,
    )).save_pretrained(llama, safe_serialization=True)
    for model in (bert, llama):
        one, two = _pool(model, 1, "classify"), _pool(model, 2, "classify")
        assert np.abs(two - one).max() < 1e-5
        assert np.ptp(one, axis=0).max() > 1e-3  # the texts are told apart


def test_each_rank_reads_half_of_the_encoder_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless.distributed import parallel_state as ps
    from forkless.model_loader import load_model

    def layer_bytes(tp: int, rank: int) -> tuple[int, torch.nn.Module]:
        with monkeypatch.context() as m:
            m.setattr(ps, "_TP", ps.GroupCoordinator(list(range(tp)), rank, name="tp") if tp > 1 else None)
            model = load_model(minilm_folder(), None, "float32", "cpu", "torch")
        layers = model.model.encoder.layer
        return sum(p.numel() for n, p in layers.named_parameters() if n.endswith("weight") and p.dim() == 2), model

    whole, full = layer_bytes(1, 0)
    half0, rank0 = layer_bytes(2, 0)
    half1, rank1 = layer_bytes(2, 1)
    assert half0 == half1 == whole // 2
    # Rank 1 holds the second half of the heads: key rows 192-383 of the checkpoint's.
    h = 384
    torch.testing.assert_close(rank1.model.encoder.layer[0].attention.self.qkv.weight[192:384],
                               full.model.encoder.layer[0].attention.self.qkv.weight[h + 192:2 * h])
    torch.testing.assert_close(rank0.model.encoder.layer[0].output.dense.weight,
                               full.model.encoder.layer[0].output.dense.weight[:, :768])
