"""Pooling on CUDA: all-MiniLM-L6-v2 equals sentence-transformers, a causal model pools
with --convert embed on the paged GPU backend, and the server answers embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.pooling.conftest import minilm_folder, mixed_sentences

pytestmark = pytest.mark.gpu


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("dtype,bar", [("float32", 0.9999), ("bfloat16", 0.995)])
def test_minilm_on_cuda_equals_sentence_transformers(dtype: str, bar: float) -> None:
    from sentence_transformers import SentenceTransformer

    from forkless import LLM

    folder = str(minilm_folder())
    sentences = mixed_sentences(100)
    ref = SentenceTransformer(folder, device="cpu").encode(sentences, convert_to_numpy=True)
    llm = LLM(folder, dtype=dtype)
    try:
        assert llm.llm_engine.config.device_config.device_type == "cuda"
        outs = llm.embed(sentences, use_tqdm=False)
    finally:
        llm.shutdown()
    for s, o, r in zip(sentences, outs, ref):
        assert _cos(o.outputs.embedding, r) >= bar, s


def test_convert_embed_on_cuda_equals_cpu(tiny_llama: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from forkless import LLM

    prompts = ["Hello there", "A longer prompt for the paged backend " * 8]
    llm = LLM(str(tiny_llama), convert="embed", dtype="float32")
    try:
        outs = llm.embed(prompts, use_tqdm=False)
    finally:
        llm.shutdown()
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, torch_dtype=torch.float32).eval()
    for o in outs:
        with torch.no_grad():
            h = model(torch.tensor([o.prompt_token_ids]), output_hidden_states=True).hidden_states[-1][0, -1]
        assert _cos(o.outputs.embedding, torch.nn.functional.normalize(h, dim=-1).numpy()) >= 0.9999


def test_embeddings_server_on_cuda(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from tests.server.conftest import start_server

    folder = minilm_folder()
    sentences = mixed_sentences(64, seed=3)
    ref = SentenceTransformer(str(folder), device="cpu").encode(sentences, convert_to_numpy=True)
    srv = start_server(folder, tmp_path, "--dtype", "float32", "--served-model-name", "minilm")
    try:
        resp = srv.client().embeddings.create(model="minilm", input=sentences)
    finally:
        srv.stop()
    for d, r in zip(resp.data, ref):
        assert _cos(d.embedding, r) >= 0.9999
