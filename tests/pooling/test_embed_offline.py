"""Offline pooling: ``LLM.embed`` / ``encode`` against sentence-transformers and transformers."""

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
from forkless.pooling_params import PoolingParams


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def minilm_llm(minilm: Path):
    llm = LLM(str(minilm), dtype="float32", kv_cache_memory=32 << 20)
    yield llm
    llm.shutdown()


def test_minilm_equals_sentence_transformers(minilm_llm, sentences, st_reference) -> None:
    outs = minilm_llm.embed(sentences, use_tqdm=False)
    assert len(outs) == len(sentences)
    lengths = [len(o.prompt_token_ids) for o in outs]
    assert min(lengths) < 10 and max(lengths) > 150, lengths  # mixed lengths, as asked
    for s, o, ref in zip(sentences, outs, st_reference):
        got = np.asarray(o.outputs.embedding, dtype=np.float32)
        assert got.shape == (384,)
        assert _cos(got, ref) >= 0.9999, s
        assert abs(np.linalg.norm(got) - 1.0) < 1e-4  # modules.json has Normalize


def test_minilm_reads_the_sentence_transformers_folder(minilm_llm) -> None:
    pooler = minilm_llm.llm_engine.config.model_config.pooler_config
    assert (pooler.pooling_type, pooler.normalize, pooler.task) == ("MEAN", True, "embed")
    assert minilm_llm.llm_engine.config.model_config.max_model_len == 256  # sentence_bert_config.json


def test_normalize_off_and_token_embeddings(minilm_llm, minilm: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm), device="cpu")
    text = "Token level outputs of a sentence."
    raw = minilm_llm.embed([text], PoolingParams(normalize=False), use_tqdm=False)[0]
    tokens = st.encode(text, output_value="token_embeddings", convert_to_numpy=True)
    mean = np.asarray(tokens).mean(axis=0)
    assert _cos(raw.outputs.embedding, mean) >= 0.9999
    assert abs(np.linalg.norm(raw.outputs.embedding) - np.linalg.norm(mean)) < 1e-3 * np.linalg.norm(mean)
    per_token = minilm_llm.encode([text], PoolingParams(task="token_embed", normalize=False), use_tqdm=False)[0]
    assert per_token.outputs.data.shape == (len(per_token.prompt_token_ids), 384)
    for got, ref in zip(per_token.outputs.data, tokens):
        assert _cos(got, ref) >= 0.9999


def test_pooling_model_refuses_generate_and_generative_model_refuses_embed(minilm_llm, tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match="pooling model"):
        minilm_llm.generate(["hello"], use_tqdm=False)
    with pytest.raises(ValueError, match="classify"):
        minilm_llm.classify(["hello"], use_tqdm=False)
    with pytest.raises(ValueError, match="maximum context length"):
        minilm_llm.embed([list(range(1000, 1300))], use_tqdm=False)
    with pytest.raises(ValueError, match="Matryoshka"):
        minilm_llm.embed(["hello"], PoolingParams(dimensions=8), use_tqdm=False)
    # The engine is still usable after refusals.
    assert len(minilm_llm.embed(["still fine"], use_tqdm=False)[0].outputs.embedding) == 384


def _hf_hidden(folder: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0]


def test_convert_embed_last_pooling_equals_transformers(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", convert="embed", kv_cache_memory=16 << 20)
    try:
        config = llm.llm_engine.config
        assert config.model_config.runner_type == "pooling"
        assert config.model_config.pooler_config.pooling_type == "LAST"
        prompts = ["Hello there, how are you?", "One", "A longer prompt " * 20]
        outs = llm.embed(prompts, use_tqdm=False)
        means = llm.encode(prompts, PoolingParams(task="token_embed", normalize=False), use_tqdm=False)
    finally:
        llm.shutdown()
    for out, all_tokens in zip(outs, means):
        hidden = _hf_hidden(tiny_llama, out.prompt_token_ids)
        ref = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
        assert _cos(out.outputs.embedding, ref) >= 0.9999
        assert np.allclose(out.outputs.embedding, ref, atol=1e-4)
        assert np.allclose(all_tokens.outputs.data, hidden.numpy(), atol=1e-3)


def test_pooler_config_mean_and_cls(tiny_llama: Path) -> None:
    prompt = "Pooling types change what one vector stands for."
    for kind in ("MEAN", "CLS"):
        llm = LLM(str(tiny_llama), dtype="float32", runner="pooling", kv_cache_memory=16 << 20,
                  pooler_config=json.dumps({"pooling_type": kind, "normalize": False}))
        try:
            out = llm.embed([prompt], use_tqdm=False)[0]
        finally:
            llm.shutdown()
        hidden = _hf_hidden(tiny_llama, out.prompt_token_ids)
        ref = hidden.mean(0) if kind == "MEAN" else hidden[0]
        assert np.allclose(out.outputs.embedding, ref.numpy(), atol=1e-4), kind


def test_bad_runner_flags(tiny_llama: Path, minilm: Path) -> None:
    with pytest.raises(ValueError, match="pooling model"):
        LLM(str(minilm), runner="generate")
    with pytest.raises(ValueError, match="unknown key"):
        LLM(str(tiny_llama), dtype="float32", runner="pooling", pooler_config='{"pooling": "MEAN"}')
    with pytest.raises(ValueError, match="pooling_type"):
        LLM(str(tiny_llama), dtype="float32", runner="pooling", pooler_config='{"pooling_type": "MAX"}')
    with pytest.raises(ValueError, match="classifier head"):
        LLM(str(tiny_llama), dtype="float32", convert="classify")


def test_matryoshka_dimensions(minilm: Path, tmp_path: Path) -> None:
    """A model whose config allows truncation (``is_matryoshka``) cuts and renormalises, as
    sentence-transformers' ``truncate_dim`` does."""
    import shutil

    from sentence_transformers import SentenceTransformer

    folder = tmp_path / "minilm-matryoshka"
    shutil.copytree(minilm, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "is_matryoshka": True}))
    texts = ["Short.", "A somewhat longer sentence about shortened embeddings."]
    llm = LLM(str(folder), dtype="float32", kv_cache_memory=8 << 20)
    try:
        outs = llm.embed(texts, PoolingParams(dimensions=128), use_tqdm=False)
        with pytest.raises(ValueError, match="dimensions=999"):
            llm.embed(texts, PoolingParams(dimensions=999), use_tqdm=False)
    finally:
        llm.shutdown()
    ref = SentenceTransformer(str(minilm), device="cpu").encode(texts, truncate_dim=128, normalize_embeddings=True)
    for out, r in zip(outs, ref):
        assert len(out.outputs.embedding) == 128
        assert _cos(out.outputs.embedding, r) >= 0.9999
        assert abs(np.linalg.norm(out.outputs.embedding) - 1.0) < 1e-4


def test_score_with_an_embedding_model_is_cosine(minilm_llm, minilm: Path) -> None:
    from sentence_transformers import SentenceTransformer

    docs = ["Kittens are young cats.", "Bond yields rose again."]
    ref = SentenceTransformer(str(minilm), device="cpu").encode(["cats", *docs])
    outs = minilm_llm.score("cats", docs, use_tqdm=False)
    assert [round(o.outputs.score, 4) for o in outs] == [round(_cos(ref[0], r), 4) for r in ref[1:]]
    with pytest.raises(ValueError, match="same"):
        minilm_llm.score(["a", "b"], ["c", "d", "e"], use_tqdm=False)
