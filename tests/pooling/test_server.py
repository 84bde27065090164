"""The pooling endpoints through a real server: the official ``openai`` client, vLLM's routes,
bad inputs, and the example IO processor plugin installed as a real package."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server.conftest import start_server

pytestmark = pytest.mark.slow  # one MiniLM server for the module (~15 s to start)


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# The chat template of minilm_server (MiniLM has none): for vLLM's messages form of the
# pooling endpoints.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def minilm_server(minilm: Path, plugin_site: Path, tmp_path_factory: pytest.TempPathFactory):
    """all-MiniLM-L6-v2 with the example zero-shot IO processor plugin and :data:`CHAT_TEMPLATE`."""
    tmp = tmp_path_factory.mktemp("minilm-server")
    (tmp / "chat.jinja").write_text(CHAT_TEMPLATE)
    srv = start_server(minilm, tmp, "--dtype", "float32", "--served-model-name", "minilm",
                       "--io-processor-plugin", "zero_shot", "--chat-template", str(tmp / "chat.jinja"),
                       site=plugin_site, env_extra={"FORKLESS_PLUGINS": "zero_shot"})
    yield srv
    srv.stop()


def test_openai_embeddings_equal_sentence_transformers(minilm_server, minilm: Path, sentences, st_reference) -> None:
    from transformers import AutoTokenizer

    import base64

    client = minilm_server.client()
    got: list = []
    # The client asks for base64 when no format is given, and decodes it (float32) itself.
    for fmt in ("float", None):
        for start in range(0 if fmt == "float" else 50, 50 if fmt == "float" else 100, 25):
            batch = sentences[start:start + 25]
            kwargs = {"encoding_format": fmt} if fmt else {}
            resp = client.embeddings.create(model="minilm", input=batch, **kwargs)
            assert [d.index for d in resp.data] == list(range(len(batch)))
            tok = AutoTokenizer.from_pretrained(minilm)
            n = sum(len(ids) for ids in tok(batch)["input_ids"])
            assert resp.usage.prompt_tokens == resp.usage.total_tokens == n
            got += [d.embedding for d in resp.data]
    assert len(got) == 100
    for s, e, ref in zip(sentences, got, st_reference):
        assert len(e) == 384
        assert _cos(e, ref) >= 0.9999, s
    one = client.embeddings.create(model="minilm", input=sentences[3], encoding_format="base64")
    raw = np.frombuffer(base64.b64decode(one.data[0].embedding), dtype="<f4")
    assert _cos(raw, st_reference[3]) >= 0.9999
    ids = AutoTokenizer.from_pretrained(minilm)(sentences[4])["input_ids"]
    by_ids = client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    assert _cos(by_ids.data[0].embedding, st_reference[4]) >= 0.9999


def test_base64_in_vllms_embed_dtypes_and_byte_orders(minilm_server) -> None:
    import base64

    def embed(**body) -> np.ndarray | bytes:
        r = httpx.post(minilm_server.url + "/v1/embeddings",
                       json={"model": "minilm", "input": "a red fox", "encoding_format": "base64", **body}, timeout=60)
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["data"][0]["embedding"])

    reference = np.frombuffer(embed(), dtype="<f4")
    assert reference.shape == (384,)
    assert np.array_equal(np.frombuffer(embed(endianness="big"), dtype=">f4"), reference)
    assert np.array_equal(np.frombuffer(embed(endianness="little", embed_dtype="float32"), dtype="<f4"), reference)
    half = np.frombuffer(embed(embed_dtype="float16", endianness="big"), dtype=">f2")
    assert half.shape == (384,) and np.array_equal(half, reference.astype(np.float16))
    bf16 = np.frombuffer(embed(embed_dtype="bfloat16"), dtype="<u2").astype(np.uint32) << 16
    widened = bf16.view(np.float32)
    assert np.allclose(widened, reference, rtol=2 ** -8, atol=0)  # 8 significant bits, rounded to nearest
    assert not np.array_equal(widened, reference)  # (they are rounded, not the same bytes)
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"model": "minilm", "input": "x", "encoding_format":
                                                               "base64", "embed_dtype": "fp8_e4m3"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "embed_dtype", r.text
    # A client's request_id names the response, as vLLM's does.
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"model": "minilm", "input": "x", "request_id": "job-7"},
                   timeout=60)
    assert r.status_code == 200 and r.json()["id"] == "embd-job-7", r.text
    # ... and an X-Request-Id header, before the body's (vLLM's order), on every pooling route.
    for route, body, prefix in (("/v1/embeddings", {"input": "x", "request_id": "job-7"}, "embd"),
                                ("/rerank", {"query": "x", "documents": ["y", "z"]}, "rerank"),
                                ("/score", {"text_1": "x", "text_2": "y"}, "score")):
        r = httpx.post(minilm_server.url + route, json={"model": "minilm", **body}, headers={"X-Request-Id": "hdr-3"},
                       timeout=60)
        assert r.status_code == 200 and r.json()["id"] == f"{prefix}-hdr-3", (route, r.text)


def test_bytes_encodings_are_vllms(minilm_server) -> None:
    # vLLM's encoding_format bytes: the raw values as the body and, in a metadata header,
    # where each output lies, its shape and dtype, and the response's id, model and usage;
    # bytes_only: the body alone.
    import json

    texts = ["a red fox", "dogs bark at night"]

    def post(path: str, **body) -> httpx.Response:
        r = httpx.post(minilm_server.url + path, json={"model": "minilm", **body}, timeout=60)
        assert r.status_code == 200, r.text
        return r

    floats = post("/v1/embeddings", input=texts).json()
    r = post("/v1/embeddings", input=texts, encoding_format="bytes", embed_dtype="float16", endianness="big")
    assert r.headers["content-type"] == "application/octet-stream"
    meta = json.loads(r.headers["metadata"])
    assert meta["model"] == "minilm" and meta["id"].startswith("embd-") and meta["usage"] == floats["usage"]
    assert [(d["index"], d["shape"], d["embed_dtype"], d["endianness"]) for d in meta["data"]] == [
        (0, [384], "float16", "big"), (1, [384], "float16", "big")]
    assert meta["data"][-1]["end"] == len(r.content) == 2 * 384 * 2
    for d, ref in zip(meta["data"], floats["data"]):
        values = np.frombuffer(r.content[d["start"]:d["end"]], dtype=">f2")
        # (Two requests' values may differ in their last float32 bits: batches differ.)
        assert np.allclose(values, ref["embedding"], rtol=2 ** -10, atol=1e-6)
    only = post("/v1/embeddings", input=texts, encoding_format="bytes_only")
    assert "metadata" not in only.headers
    assert np.allclose(np.frombuffer(only.content, dtype="=f4").reshape(2, 384),
                       [d["embedding"] for d in floats["data"]], rtol=1e-5, atol=1e-6)
    tokens = post("/pooling", input="cats", task="token_embed", encoding_format="bytes")
    assert json.loads(tokens.headers["metadata"])["data"][0]["shape"] == [3, 384]  # [CLS] cats [SEP]
    assert len(tokens.content) == 3 * 384 * 4


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/embeddings", {"input": []}, "input", "empty"),
    ("/v1/embeddings", {"input": ""}, "input", "empty string"),
    ("/v1/embeddings", {"input": "x", "request_id": ""}, "request_id", "must not be empty"),
    ("/v1/embeddings", {"input": ["a", ""]}, "input", "input[1] is empty"),
    ("/v1/embeddings", {"input": "word " * 400}, "input", "maximum context length"),
    ("/v1/embeddings", {"input": "hello", "encoding_format": "int8"}, "encoding_format", "'bytes' or 'bytes_only'"),
    ("/v1/embeddings", {"input": ["x"] * 257}, "input", "257 inputs in input; this server takes at most 256"),
    ("/rerank", {"query": "q", "documents": ["x"] * 257}, "documents", "257 inputs in documents"),
    ("/v1/embeddings", {"input": [101, 99999, 102]}, "input", "outside the vocabulary"),
    ("/v1/embeddings", {"input": [[101, 102], [-1]]}, "input", "outside the vocabulary"),
    ("/v1/embeddings", {"input": "hello", "dimensions": 8}, "dimensions", "Matryoshka"),
    ("/pooling", {"input": "hello", "dimensions": 384}, "dimensions", "Matryoshka"),
    ("/v1/embeddings", {"input": "hello", "priority": 1}, "priority", "scheduling policy"),
    ("/v1/embeddings", {"input": "x", "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs", "multimodal"),
    ("/rerank", {"query": "q", "documents": ["d"], "max_tokens_per_doc": 5}, "max_tokens_per_doc", "use trunc"),
    ("/score", {"text_1": "q", "text_2": "d", "truncation_side": "left"}, "truncation_side", "first tokens"),
    ("/v1/completions", {"prompt": "hello"}, "model", "pooling model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "model", "pooling model"),
    ("/classify", {"input": "hello"}, "input", "classify"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2", "same"),
    ("/rerank", {"query": "q", "documents": []}, "documents", "empty"),
    ("/pooling", {"input": "hello", "task": "sing"}, "task", "sing"),
    ("/pooling", {"data": {"texts": "not a list", "labels": ["x"]}}, "data", "data.texts"),
    ("/pooling", {"data": {"texts": ["t"], "labels": ["x"], "top_k": 5}}, "data", "top_k"),
])
def test_bad_inputs_are_400(minilm_server, path, body, param, words) -> None:
    r = httpx.post(minilm_server.url + path, json={"model": "minilm", **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"], err
    if param is not None:
        assert err["param"] == param
    assert err["type"] == "BadRequestError"


def test_bad_input_through_openai_client(minilm_server) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        minilm_server.client().embeddings.create(model="minilm", input=[[1, 2, 40000]])


def test_pooling_score_and_rerank(minilm_server, minilm: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm), device="cpu")
    docs = ["Kittens are young cats.", "The central bank raised interest rates.", "Dogs bark at night."]
    ref = st.encode(["cats", *docs])
    r = httpx.post(minilm_server.url + "/pooling", json={"input": ["cats", "dogs"]}, timeout=60).json()
    assert r["object"] == "list" and r["data"][0]["object"] == "pooling"
    assert _cos(r["data"][0]["data"], ref[0]) >= 0.9999
    score = httpx.post(minilm_server.url + "/score", json={"text_1": "cats", "text_2": docs}, timeout=60).json()
    want = [_cos(ref[0], d) for d in ref[1:]]
    assert [round(d["score"], 4) for d in score["data"]] == [round(w, 4) for w in want]
    # vLLM's other names of the pairs score the same; a single document reranks too.
    for names in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        same = httpx.post(minilm_server.url + "/score", json=dict(zip(names, ("cats", docs))), timeout=60)
        assert same.status_code == 200, same.text
        assert [round(d["score"], 4) for d in same.json()["data"]] == [round(w, 4) for w in want]
    mismatched = httpx.post(minilm_server.url + "/score", json={"data_1": ["a", "b"], "data_2": docs}, timeout=60)
    assert mismatched.status_code == 400 and mismatched.json()["error"]["param"] == "data_2", mismatched.text
    one = httpx.post(minilm_server.url + "/rerank", json={"query": "cats", "documents": docs[0]}, timeout=60)
    assert one.status_code == 200, one.text
    assert [(r["index"], r["document"]["text"]) for r in one.json()["results"]] == [(0, docs[0])]
    rerank = httpx.post(minilm_server.url + "/v1/rerank",
                        json={"query": "cats", "documents": docs, "top_n": 2}, timeout=60).json()
    order = list(np.argsort(-np.asarray(want))[:2])
    assert [res["index"] for res in rerank["results"]] == order
    assert rerank["results"][0]["document"]["text"] == docs[order[0]]
    # vLLM's rerank usage has prompt_tokens next to total_tokens (clients read either).
    assert rerank["usage"]["prompt_tokens"] == rerank["usage"]["total_tokens"] == score["usage"]["prompt_tokens"]
    tokens = httpx.post(minilm_server.url + "/pooling", json={"input": "cats", "task": "token_embed"},
                        timeout=60).json()
    assert np.asarray(tokens["data"][0]["data"]).shape == (3, 384)  # [CLS] cats [SEP]


def test_io_processor_plugin_zero_shot(minilm_server) -> None:
    labels = ["sports", "cooking", "finance"]
    texts = ["The striker scored twice in the final.", "Simmer the sauce and add basil.",
             "Shares fell as bond yields rose."]
    r = httpx.post(minilm_server.url + "/pooling", json={"data": {"texts": texts, "labels": labels, "top_k": 2}},
                   timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    results = body["data"]["results"]
    assert [res["labels"][0]["label"] for res in results] == labels
    assert all(len(res["labels"]) == 2 and res["labels"][0]["score"] >= res["labels"][1]["score"]
               for res in results)
    first = body["data"]["labels_embedded"]
    assert first == 3
    again = httpx.post(minilm_server.url + "/pooling",
                       json={"data": {"texts": ["Whisk the eggs."], "labels": labels + ["travel"]}}, timeout=60).json()
    assert again["data"]["results"][0]["labels"][0]["label"] == "cooking"
    assert again["data"]["labels_embedded"] == first + 1  # only the new label was embedded


def test_classify_server_and_generative_server_refusals(tiny_bert_classifier: Path, tiny_llama: Path,
                                                         tmp_path: Path) -> None:
    from forkless import LLM

    texts = ["good", "bad movie " * 4]
    srv = start_server(tiny_bert_classifier, tmp_path, "--dtype", "float32", "--max-model-len", "128")
    try:
        r = httpx.post(srv.url + "/classify", json={"input": texts}, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        emb = httpx.post(srv.url + "/v1/embeddings", json={"input": "x"}, timeout=60)
        assert emb.status_code == 400 and "embed" in emb.json()["error"]["message"]
    finally:
        srv.stop()
    llm = LLM(str(tiny_bert_classifier), dtype="float32", kv_cache_memory=8 << 20)
    try:
        offline = llm.classify(texts, use_tqdm=False)
    finally:
        llm.shutdown()
    for d, o in zip(data, offline):
        assert np.allclose(d["probs"], o.outputs.probs, atol=1e-6)
        assert d["label"] == f"class_{int(np.argmax(o.outputs.probs))}" and d["num_classes"] == 3
    gen = start_server(tiny_llama, tmp_path)
    try:
        for path, body in (("/v1/embeddings", {"input": "hello"}), ("/pooling", {"input": "hello"}),
                           ("/classify", {"input": "hello"})):
            r = httpx.post(gen.url + path, json=body, timeout=60)
            assert r.status_code == 400 and "generative model" in r.json()["error"]["message"], r.text
    finally:
        gen.stop()


def test_add_special_tokens_false_embeds_the_text_alone(minilm_server, minilm: Path) -> None:
    # vLLM's add_special_tokens (default true): false tokenizes the text without [CLS] and
    # [SEP], which changes the embedding: the same as sending the text's bare token ids.
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(minilm)("a red fox", add_special_tokens=False)["input_ids"]

    def post(path: str, **body) -> dict:
        r = httpx.post(minilm_server.url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    for path, key in (("/v1/embeddings", "embedding"), ("/pooling", "data")):
        without = post(path, input="a red fox", add_special_tokens=False)
        assert without["usage"]["prompt_tokens"] == len(bare)
        by_ids = post(path, input=bare)
        assert _cos(without["data"][0][key], by_ids["data"][0][key]) >= 0.99999
        default = post(path, input="a red fox", add_special_tokens=True)
        assert default["usage"]["prompt_tokens"] == len(bare) + 2
        assert _cos(default["data"][0][key], without["data"][0][key]) < 0.999


def test_messages_are_embedded_through_the_chat_template(minilm_server) -> None:
    # vLLM's chat form of /v1/embeddings and /pooling: the conversation rendered by the chat
    # template is one prompt, tokenized without added special tokens (the template's own).
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a red fox"}]
    rendered = "system: Be brief.\nuser: a red fox\n"

    def post(path: str, **body) -> httpx.Response:
        return httpx.post(minilm_server.url + path, json={"model": "minilm", **body}, timeout=60)

    for path, key in (("/v1/embeddings", "embedding"), ("/pooling", "data")):
        chat = post(path, messages=messages)
        assert chat.status_code == 200, chat.text
        plain = post(path, input=rendered, add_special_tokens=False).json()
        assert chat.json()["usage"] == plain["usage"]
        assert len(chat.json()["data"]) == 1
        assert _cos(chat.json()["data"][0][key], plain["data"][0][key]) >= 0.99999
    cut = post("/v1/embeddings", messages=messages, truncate_prompt_tokens=3)
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 3, cut.text
    for body, param in (({"messages": messages, "input": "x"}, "input"),
                        ({"messages": messages, "add_special_tokens": True}, "add_special_tokens"),
                        ({"messages": messages, "chat_template": "{{ 1 }}"}, "chat_template"),
                        ({"messages": []}, "messages")):
        r = post("/v1/embeddings", **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_truncate_prompt_tokens(minilm_server) -> None:
    r = httpx.post(minilm_server.url + "/v1/embeddings",
                   json={"input": "word " * 400, "truncate_prompt_tokens": 16}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 16
    # As vLLM: a truncation longer than the context (or of nothing) is refused, naming it.
    for path, body in (("/v1/embeddings", {"input": "hello"}), ("/score", {"text_1": "a", "text_2": "b"})):
        for keep in (0, 257):
            r = httpx.post(minilm_server.url + path, json={**body, "truncate_prompt_tokens": keep}, timeout=60)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "truncate_prompt_tokens" and "max_model_len = 256" in err["message"], err


def test_unknown_io_processor_plugin_fails_at_start(minilm: Path, plugin_site: Path, tmp_path: Path) -> None:
    from tests.conftest import plugin_env, run_forkless

    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="zero_shot")
    proc = run_forkless(["serve", str(minilm), "--port", "0", "--io-processor-plugin", "nope"], env, timeout=120)
    assert proc.returncode != 0
    assert "nope" in proc.stderr and "zero_shot" in proc.stderr, proc.stderr[-2000:]


def test_a_cross_encoder_truncates_its_pairs(tiny_cross_encoder: Path, tmp_path: Path) -> None:
    # /score and /rerank pair each text with the query in one prompt; truncate_prompt_tokens
    # cuts that prompt (the longer text first), as it cuts /classify's inputs.
    srv = start_server(tiny_cross_encoder, tmp_path, "--dtype", "float32", "--served-model-name", "ce",
                       "--max-model-len", "128")
    try:
        long_doc = "the quick brown fox jumps over the lazy dog " * 20  # ~180 tokens: over the context

        def post(path: str, **body) -> httpx.Response:
            return httpx.post(srv.url + path, json={"model": "ce", **body}, timeout=60)

        # use_activation=false (vLLM's): the raw logits, whose sigmoid the default gives.
        scores = post("/score", text_1="a fox", text_2=["a dog", "a cat"]).json()["data"]
        logits = post("/score", text_1="a fox", text_2=["a dog", "a cat"], use_activation=False).json()["data"]
        assert np.allclose([1 / (1 + np.exp(-d["score"])) for d in logits], [d["score"] for d in scores], atol=1e-5)
        assert not np.allclose([d["score"] for d in logits], [d["score"] for d in scores], atol=1e-3)
        ranked = post("/rerank", query="a fox", documents=["a dog", "a cat"], use_activation=False).json()["results"]
        assert sorted(r["relevance_score"] for r in ranked) == pytest.approx(sorted(d["score"] for d in logits),
                                                                             abs=1e-5)
        short = post("/score", text_1="a fox", text_2=["a dog", "a cat"], truncate_prompt_tokens=6)
        assert short.status_code == 200, short.text
        assert short.json()["usage"]["prompt_tokens"] == 12  # two pairs of 6
        whole = post("/score", text_1="a fox", text_2=["a dog", "a cat"])
        assert whole.json()["usage"]["prompt_tokens"] > 12
        assert post("/score", text_1="a fox", text_2=long_doc).status_code == 400  # too long untruncated
        for body in ({"truncate_prompt_tokens": 100}, {"truncate_prompt_tokens": -1}):
            r = post("/score", text_1="a fox", text_2=long_doc, **body)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == (100 if body["truncate_prompt_tokens"] == 100 else 128)
            r = post("/rerank", query="a fox", documents=[long_doc, "a dog"], **body)
            assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
    finally:
        srv.stop()


def test_pooling_requests_are_timed_on_metrics(minilm_server) -> None:
    """A pooling request's result counts as its first and last token, as vLLM times every
    output: its latency, time to first token, prompt tokens and phases reach /metrics."""
    from tests.server.conftest import wait_until
    from tests.server.test_metrics import scrape, value

    names = ("forkless:e2e_request_latency_seconds", "forkless:time_to_first_token_seconds",
             "forkless:request_prefill_time_seconds", "forkless:request_inference_time_seconds")

    def totals() -> dict[str, float]:
        m = scrape(minilm_server)
        out = {"done": value(m, "forkless:request_success_total"),
               "prompt": value(m, "forkless:prompt_tokens_total")}
        for name in names:
            out[name + "_count"] = value(m, name + "_count")
            out[name + "_sum"] = value(m, name + "_sum")
        return out

    before = totals()
    r = httpx.post(minilm_server.url + "/v1/embeddings",
                   json={"input": ["timed one", "timed two, a little longer", "three"]}, timeout=60)
    assert r.status_code == 200, r.text
    wait_until(lambda: totals()["done"] >= before["done"] + 3, 10)
    after = totals()
    assert after["done"] - before["done"] == 3
    assert after["prompt"] - before["prompt"] == r.json()["usage"]["prompt_tokens"]
    for name in names:
        assert after[name + "_count"] - before[name + "_count"] == 3, name
        assert after[name + "_sum"] - before[name + "_sum"] > 0, name


def test_unknown_fields_are_refused_and_invocations_route_by_shape(minilm_server) -> None:
    # An unknown field is a 400 naming it on every pooling route (not ignored).
    for path, body in (("/v1/embeddings", {"input": "hi"}), ("/pooling", {"input": "hi"}),
                       ("/score", {"text_1": "a", "text_2": "b"}), ("/rerank", {"query": "a", "documents": ["b"]})):
        r = httpx.post(minilm_server.url + path, json={**body, "dimensionz": 3}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensionz", (path, r.text)
    # vLLM's SageMaker /invocations: an embedding body is embedded, a rerank body reranked.
    direct = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": "a red fox"}, timeout=60).json()
    invoked = httpx.post(minilm_server.url + "/invocations", json={"input": "a red fox"}, timeout=60).json()
    assert invoked["object"] == "list" and invoked["data"][0]["embedding"] == direct["data"][0]["embedding"]
    rerank = {"query": "a red fox", "documents": ["a fox", "tax law"]}
    invoked = httpx.post(minilm_server.url + "/invocations", json=rerank, timeout=60).json()["results"]
    direct = httpx.post(minilm_server.url + "/rerank", json=rerank, timeout=60).json()["results"]
    assert [r["index"] for r in invoked] == [r["index"] for r in direct] == [0, 1]
    assert [r["relevance_score"] for r in invoked] == pytest.approx([r["relevance_score"] for r in direct], abs=1e-6)
    r = httpx.post(minilm_server.url + "/invocations", json={"messages_": []}, timeout=60)
    assert r.status_code == 400 and "an embedding request" in r.json()["error"]["message"], r.text
