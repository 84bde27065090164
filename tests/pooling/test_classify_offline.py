"""Offline classification, rewards and scoring against transformers: BERT heads, a
cross-encoder, and a causal ``*ForSequenceClassification`` model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from forkless import LLM

# Each test builds an engine on a real or tiny model and compares it with transformers or
# sentence-transformers: ~10-60 s apiece on the shared 2-core CPU.
pytestmark = pytest.mark.slow


def test_bert_classifier_equals_transformers(tiny_bert_classifier: Path) -> None:
    from transformers import AutoTokenizer, BertForSequenceClassification

    texts = ["I loved this film.", "Terrible, never again " * 5, "ok"]
    llm = LLM(str(tiny_bert_classifier), dtype="float32", kv_cache_memory=8 << 20)
    try:
        assert llm.llm_engine.config.model_config.pooler_config.task == "classify"
        outs = llm.classify(texts, use_tqdm=False)
        with pytest.raises(ValueError, match="cannot score"):
            llm.score("a", ["b"], use_tqdm=False)
    finally:
        llm.shutdown()
    tok = AutoTokenizer.from_pretrained(tiny_bert_classifier)
    ref_model = BertForSequenceClassification.from_pretrained(tiny_bert_classifier).eval()
    for text, out in zip(texts, outs):
        with torch.no_grad():
            logits = ref_model(**tok(text, return_tensors="pt")).logits[0]
        probs = torch.softmax(logits, -1).numpy()
        assert out.outputs.num_classes == 3
        assert np.allclose(out.outputs.probs, probs, atol=1e-5), (out.outputs.probs, probs)


def test_cross_encoder_scores_pairs_with_token_types(tiny_cross_encoder: Path) -> None:
    from transformers import AutoTokenizer, BertForSequenceClassification

    query, docs = "what do cats eat", ["Cats eat fish and meat.", "The stock market fell today.", "Kittens drink milk"]
    llm = LLM(str(tiny_cross_encoder), dtype="float32", kv_cache_memory=8 << 20)
    try:
        outs = llm.score(query, docs, use_tqdm=False)
        pairs = llm.score([query, docs[0]], [docs[1], docs[2]], use_tqdm=False)
    finally:
        llm.shutdown()
    tok = AutoTokenizer.from_pretrained(tiny_cross_encoder)
    ref_model = BertForSequenceClassification.from_pretrained(tiny_cross_encoder).eval()

    def ref(a: str, b: str) -> float:
        enc = tok(a, b, return_tensors="pt")
        assert enc["token_type_ids"].max() == 1  # the pair's second segment has type 1
        with torch.no_grad():
            return float(torch.sigmoid(ref_model(**enc).logits[0, 0]))

    for doc, out in zip(docs, outs):
        assert abs(out.outputs.score - ref(query, doc)) < 1e-5
    assert abs(pairs[0].outputs.score - ref(query, docs[1])) < 1e-5
    assert abs(pairs[1].outputs.score - ref(docs[0], docs[2])) < 1e-5


def test_causal_sequence_classification_equals_transformers(tiny_llama: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    folder = tmp_path / "llama-cls"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_llama / name).exists():
            shutil.copy(tiny_llama / name, folder / name)
    cfg = json.loads((tiny_llama / "config.json").read_text())
    config = LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=4, pad_token_id=0,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    ref_model = LlamaForSequenceClassification(config).eval()
    ref_model.save_pretrained(folder, safe_serialization=True)
    texts = ["first text to classify", "a second, longer text to classify " * 3]
    llm = LLM(str(folder), dtype="float32", kv_cache_memory=8 << 20)
    try:
        assert llm.llm_engine.config.model_config.pooler_config.pooling_type == "LAST"
        outs = llm.classify(texts, use_tqdm=False)
        rewards = llm.reward(texts, use_tqdm=False)  # vLLM's name; an AttributeError before
    finally:
        llm.shutdown()
    tok = AutoTokenizer.from_pretrained(folder)
    for text, out, reward in zip(texts, outs, rewards):
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            logits = ref_model(torch.tensor([ids])).logits[0]
            per_token = ref_model.score(ref_model.model(torch.tensor([ids])).last_hidden_state)[0]
        assert np.allclose(out.outputs.probs, torch.softmax(logits, -1).numpy(), atol=1e-5)
        assert reward.outputs.data.shape == (len(ids), 4)
        assert np.allclose(reward.outputs.data, torch.softmax(per_token, -1).numpy(), atol=1e-5)


def test_bad_token_types_are_refused_before_the_engine(tiny_cross_encoder: Path) -> None:
    from forkless.pooling_params import PoolingParams

    llm = LLM(str(tiny_cross_encoder), dtype="float32", kv_cache_memory=8 << 20)
    try:
        for types in ([0, 1], [0, 0, 7]):
            with pytest.raises(ValueError, match="token_type_ids"):
                llm.encode([[101, 2000, 102]], PoolingParams(token_type_ids=types), use_tqdm=False)
        assert len(llm.score("a", ["b"], use_tqdm=False)) == 1  # still serving
    finally:
        llm.shutdown()


def test_bert_configs_read_without_transformers_match_autoconfig(minilm: Path, tiny_bert_classifier: Path) -> None:
    from transformers import AutoConfig

    from forkless.models.hf_config import JsonHFConfig, load_hf_config

    fields = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "hidden_act",
              "layer_norm_eps", "max_position_embeddings", "type_vocab_size", "vocab_size",
              "num_labels")
    for folder in (minilm, tiny_bert_classifier):
        ours, ref = load_hf_config(folder), AutoConfig.from_pretrained(folder)
        assert isinstance(ours, JsonHFConfig)  # the fast path, no transformers config class
        assert {f: getattr(ours, f) for f in fields} == {f: getattr(ref, f) for f in fields}
