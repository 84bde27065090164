"""LoRA through a real ``forkless serve`` with the openai client: --lora-modules (both forms),
/v1/models, adapter selection by ``model``, runtime load/unload and their errors, and
host-cache eviction with 4 adapters in rotation over --max-cpu-loras 2."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.lora.test_lora_offline import _hf_greedy
from tests.server.conftest import start_server, stop_and_check

PROMPT_IDS = [[54, 71, 66, 35, 82, 84, 72, 68, 74], [48, 65, 82, 73, 83, 35, 73, 83]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def llama(lora_models):
    return lora_models["llama"]


@pytest.fixture(scope="module")
def references(llama):
    base, adapters = llama
    refs = {None: _hf_greedy(base, None, PROMPT_IDS)}
    for name, path in adapters.items():
        refs[name] = _hf_greedy(base, path, PROMPT_IDS)
    return refs


@pytest.fixture(scope="module")
def lora_server(llama, tmp_path_factory):
    base, adapters = llama
    tmp = tmp_path_factory.mktemp("lora-server")
    # base_model_name is not a served name: as in vLLM, the adapter's parent is the served model.
    json_form = json.dumps({"name": "qv", "path": str(adapters["qv-r16-rslora"]), "base_model_name": "org/the-base"})
    srv = start_server(base, tmp, "--served-model-name", "tiny", "--enable-lora", "--max-loras", "2",
                       "--max-cpu-loras", "2", "--max-lora-rank", "32",
                       "--lora-modules", f"all={adapters['all-r8']}", json_form,
                       env_extra={"FORKLESS_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def _tokens(client: openai.OpenAI, model: str, tokenizer_ids: list[int]) -> str:
    # The text, without a trailing incomplete UTF-8 sequence: the server holds one back.
    return client.completions.create(model=model, prompt=tokenizer_ids, max_tokens=MAX_TOKENS, temperature=0.0,
                                     extra_body={"ignore_eos": True}).choices[0].text.rstrip("\ufffd")


@pytest.fixture(scope="module")
def detok(llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama[0])
    return lambda ids: tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


def test_models_lists_adapters_with_parent(lora_server):
    cards = {m.id: m for m in lora_server.client().models.list().data}
    assert set(cards) >= {"tiny", "all", "qv"}
    assert cards["all"].parent == "tiny" and cards["qv"].parent == "tiny"
    assert getattr(cards["tiny"], "parent", None) is None


def test_model_field_selects_the_adapter(lora_server, references, detok):
    client = lora_server.client()
    for model, ref in (("tiny", None), ("all", "all-r8"), ("qv", "qv-r16-rslora")):
        for ids, expected in zip(PROMPT_IDS, references[ref]):
            assert _tokens(client, model, ids) == detok(expected), model
    chat = client.chat.completions.create(model="all", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.choices[0].message.content is not None


def test_responses_name_the_adapter(lora_server):
    # As vLLM: a response names the model it came from, the adapter for an adapter's request.
    client = lora_server.client()
    for model in ("tiny", "qv"):
        assert client.completions.create(model=model, prompt="Hi", max_tokens=2).model == model
        chunks = list(client.completions.create(model=model, prompt="Hi", max_tokens=3, stream=True))
        assert chunks and {c.model for c in chunks} == {model}
        messages = [{"role": "user", "content": "Hi"}]
        assert client.chat.completions.create(model=model, messages=messages, max_tokens=2).model == model
        chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=3, stream=True))
        assert chunks and {c.model for c in chunks} == {model}


def test_unknown_model_is_404(lora_server):
    with pytest.raises(openai.NotFoundError) as info:
        lora_server.client().completions.create(model="nope", prompt="x", max_tokens=1)
    err = info.value.body
    assert err["code"] == "model_not_found" and "tiny, all, qv" in err["message"]


def test_runtime_load_unload_and_errors(lora_server, llama, references, detok, tmp_path):
    base, adapters = llama
    url = lora_server.url
    ok = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": str(adapters["mlp-o-r32"])})
    assert ok.status_code == 200, ok.text
    assert _tokens(lora_server.client(), "mlp", PROMPT_IDS[0]) == detok(references["mlp-o-r32"][0])
    dup = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": str(adapters["all-r8"])})
    assert dup.status_code == 400 and "already been loaded" in dup.json()["error"]["message"]
    # vLLM's load_inplace: the name now serves the other folder's weights, under the same id.
    swap = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": str(adapters["all-r8"]),
                                                          "load_inplace": True})
    assert swap.status_code == 200, swap.text
    assert _tokens(lora_server.client(), "mlp", PROMPT_IDS[0]) == detok(references["all-r8"][0])
    assert _tokens(lora_server.client(), "mlp", PROMPT_IDS[0]) == detok(references["all-r8"][0])
    # Back again; a refused request first does not use up the reload.
    back = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "mlp", "lora_path": str(adapters["mlp-o-r32"]),
                                                          "load_inplace": True})
    assert back.status_code == 200, back.text
    with pytest.raises(openai.BadRequestError):
        lora_server.client().completions.create(model="mlp", prompt=[10 ** 7], max_tokens=1)
    assert _tokens(lora_server.client(), "mlp", PROMPT_IDS[0]) == detok(references["mlp-o-r32"][0])
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(tmp_path / "none")})
    assert bad.status_code == 400 and "LoRA adapter 'bad'" in bad.json()["error"]["message"]
    missing_field = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x"})
    assert missing_field.status_code == 400
    a_file = tmp_path / "adapter.txt"
    a_file.write_text("not an adapter")
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(a_file)})
    assert bad.status_code == 400 and "a file, not a PEFT adapter folder" in bad.json()["error"]["message"]
    # Fields the endpoints do not read are refused, and an id that is not the adapter's too.
    extra = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "y", "lora_path": str(a_file),
                                                           "lora_int_id": 5})
    assert extra.status_code == 400 and extra.json()["error"]["param"] == "lora_int_id", extra.text
    wrong_id = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "mlp", "lora_int_id": 10 ** 6})
    assert wrong_id.status_code == 400 and wrong_id.json()["error"]["param"] == "lora_int_id", wrong_id.text
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "mlp"})
    assert gone.status_code == 200, gone.text
    again = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "mlp"})
    assert again.status_code == 404 and again.json()["error"]["type"] == "NotFoundError"
    with pytest.raises(openai.NotFoundError):
        lora_server.client().completions.create(model="mlp", prompt="x", max_tokens=1)
    assert "mlp" not in {m.id for m in lora_server.client().models.list().data}


def _hostile_adapters(good: Path, tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (adapter path, what the 400 must say): folders whose safetensors or config
    a torch-free check must refuse, and paths the OS refuses to look at."""
    import shutil
    import struct

    def copy(name: str) -> Path:
        return Path(shutil.copytree(good, tmp / name))

    truncated = copy("truncated")
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # header intact, data cut
    shape = copy("shape-not-a-list")
    raw = (shape / "adapter_model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    first = next(k for k in header if k != "__metadata__")
    header[first]["shape"] = 5
    new = json.dumps(header).encode()
    (shape / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + size:])
    infinite = copy("alpha-infinite")
    cfg = json.loads((infinite / "adapter_config.json").read_text())
    cfg["lora_alpha"] = float("inf")  # json writes Infinity, and reads it back
    (infinite / "adapter_config.json").write_text(json.dumps(cfg))
    return {
        "truncated": (str(truncated), "adapter_model.safetensors"),
        "shape": (str(shape), "shape"),
        "alpha": (str(infinite), "lora_alpha"),
        "long-path": ("/tmp/" + "a" * 5000, "LoRA adapter 'long-path'"),
        "no-such-user": ("~no-such-user-forkless/adapter", "LoRA adapter 'no-such-user'"),
    }


def test_bad_loads_are_400s_never_500s(lora_server, llama, tmp_path):
    """vLLM's answers to a load or unload without a name or path (400 InvalidUserInput), and
    a 400 naming the adapter for adapters a torch-free check must refuse (a truncated
    safetensors that would fail every request, a header of the wrong shape, an infinite
    lora_alpha) and for paths the OS refuses (too long, an unknown ~user)."""
    _, adapters = llama
    url = lora_server.url
    load, unload = f"{url}/v1/load_lora_adapter", f"{url}/v1/unload_lora_adapter"
    for body in ({"lora_name": "", "lora_path": str(adapters["all-r8"])}, {"lora_name": "x", "lora_path": ""}):
        r = httpx.post(load, json=body, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
        assert r.json()["error"]["type"] == "InvalidUserInput"
    r = httpx.post(unload, json={"lora_name": ""}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "'lora_name' needs to be provided to unload a LoRA adapter."
    for name, (path, problem) in _hostile_adapters(adapters["all-r8"], tmp_path).items():
        r = httpx.post(load, json={"lora_name": name, "lora_path": path}, timeout=30)
        assert r.status_code == 400, (name, r.text)
        assert problem in r.json()["error"]["message"], (name, r.text)
    # vLLM's messages quote the name.
    dup = httpx.post(load, json={"lora_name": "all", "lora_path": str(adapters["all-r8"])}, timeout=30)
    assert dup.status_code == 400 and "The lora adapter 'all' has already been loaded" in dup.text, dup.text
    gone = httpx.post(unload, json={"lora_name": "never-loaded"}, timeout=30)
    assert gone.status_code == 404 and "The lora adapter 'never-loaded' cannot be found" in gone.text, gone.text
    listed = {m.id for m in lora_server.client().models.list().data}
    assert listed.isdisjoint({"", "x", "truncated", "shape", "alpha", "long-path", "no-such-user"})
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200


def test_eviction_with_four_adapters_in_rotation(lora_server, llama, references, detok):
    """--max-cpu-loras 2 and --max-loras 2 with 4 adapters requested in turn (and at once)."""
    base, adapters = llama
    for name in ("rot-a", "rot-b"):
        src = adapters["mlp-o-r32"] if name == "rot-a" else adapters["qv-r16-rslora"]
        r = httpx.post(f"{lora_server.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(src)})
        assert r.status_code == 200, r.text
    expected = {"all": "all-r8", "qv": "qv-r16-rslora", "rot-a": "mlp-o-r32", "rot-b": "qv-r16-rslora"}
    client = lora_server.client()
    for _ in range(2):
        for model, ref in expected.items():
            assert _tokens(client, model, PROMPT_IDS[1]) == detok(references[ref][1]), model

    async def all_at_once():
        import asyncio

        aclient = lora_server.async_client()
        models = list(expected) * 2
        outs = await asyncio.gather(*(aclient.completions.create(
            model=m, prompt=PROMPT_IDS[0], max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True})
            for m in models))
        return list(zip(models, outs))

    import asyncio

    for model, out in asyncio.run(all_at_once()):
        assert out.choices[0].text.rstrip("\ufffd") == detok(references[expected[model]][0]), model
    assert "evicted adapter" in lora_server.log()
    for name in ("rot-a", "rot-b"):
        httpx.post(f"{lora_server.url}/v1/unload_lora_adapter", json={"lora_name": name})


def test_lora_modules_errors(llama, tmp_path):
    from tests.conftest import plugin_env, run_forkless

    base, adapters = llama
    env = plugin_env(None, tmp_path)
    no_enable = run_forkless(["serve", str(base), "--port", "0", "--lora-modules", f"a={adapters['all-r8']}"], env,
                             timeout=120)
    assert no_enable.returncode == 2 and "--lora-modules needs --enable-lora" in no_enable.stderr
    bad_form = run_forkless(["serve", str(base), "--port", "0", "--enable-lora", "--lora-modules", "just-a-name"],
                            env, timeout=120)
    assert bad_form.returncode == 2 and "expected name=path" in bad_form.stderr


def _copy_for(src: Path, dst: Path, base_model_name: str) -> Path:
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = base_model_name
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def resolver_server(llama, plugin_site, tmp_path_factory):
    """The filesystem resolver (forkless's own plugin) and the example resolver plugin
    (installed as a real package), both enabled by FORKLESS_PLUGINS."""
    base, adapters = llama
    tmp = tmp_path_factory.mktemp("lora-resolvers")
    cache = tmp / "lora-cache"
    cache.mkdir()
    # As vLLM's, the filesystem resolver serves adapters for the model as --model gave it,
    # not for its served name.
    _copy_for(adapters["all-r8"], cache / "fs-adapter", str(base))
    _copy_for(adapters["all-r8"], cache / "both", str(base))
    _copy_for(adapters["all-r8"], cache / "other-base", "some-other-model")
    _copy_for(adapters["all-r8"], cache / "for-served-name", "tiny")
    table = tmp / "table.json"
    table.write_text(json.dumps({"table-adapter": str(adapters["mlp-o-r32"]),
                                 "both": str(adapters["qv-r16-rslora"]), "broken": str(tmp / "nothing")}))
    srv = start_server(base, tmp, "--served-model-name", "tiny", "--enable-lora", "--max-loras", "2",
                       "--max-lora-rank", "32", site=plugin_site,
                       env_extra={"FORKLESS_ALLOW_RUNTIME_LORA_UPDATING": "1",
                                  "FORKLESS_PLUGINS": "lora_filesystem_resolver,example_lora_resolver",
                                  "FORKLESS_LORA_RESOLVER_CACHE_DIR": str(cache),
                                  "FORKLESS_EXAMPLE_LORA_TABLE": str(table)})
    srv.extra["cache"], srv.extra["table"], srv.extra["base"] = cache, table, str(base)
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_resolvers_find_adapters_in_registration_order(resolver_server, references, detok):
    client = resolver_server.client()
    assert _tokens(client, "fs-adapter", PROMPT_IDS[0]) == detok(references["all-r8"][0])
    assert _tokens(client, "table-adapter", PROMPT_IDS[0]) == detok(references["mlp-o-r32"][0])
    # Both know "both": example_lora_resolver sorts first, so its table answers.
    assert _tokens(client, "both", PROMPT_IDS[0]) == detok(references["qv-r16-rslora"][0])
    listed = {m.id: m.parent for m in client.models.list().data}
    assert listed["fs-adapter"] == listed["table-adapter"] == "tiny"
    # An adapter for another base model, a name nobody knows: 404 naming the known models.
    for name in ("other-base", "for-served-name", "nobody-knows", "../fs-adapter"):
        with pytest.raises(openai.NotFoundError) as info:
            client.completions.create(model=name, prompt="x", max_tokens=1)
        assert "fs-adapter" in info.value.body["message"]
    # A resolver that names a folder without an adapter: the request's 400, the server lives on.
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="broken", prompt="x", max_tokens=1)
    assert "LoRA adapter 'broken'" in info.value.body["message"]
    assert _tokens(client, "fs-adapter", PROMPT_IDS[1]) == detok(references["all-r8"][1])


def test_filesystem_resolver_stays_inside_its_folder(resolver_server, llama, references, detok, tmp_path):
    """As vLLM's: a name may be a path below the folder ("org/adapter"), but what it names
    must resolve inside the folder -- a symlink to an adapter elsewhere is not served, one
    to an adapter inside it is (from the folder it points to); "..", "." and absolute names
    find nothing."""
    import os

    _, adapters = llama
    cache = resolver_server.extra["cache"]
    outside = _copy_for(adapters["all-r8"], tmp_path / "outside", resolver_server.extra["base"])
    os.symlink(outside, cache / "link-out")
    os.symlink(cache / "fs-adapter", cache / "link-in")
    (cache / "org").mkdir()
    _copy_for(adapters["mlp-o-r32"], cache / "org" / "nested", resolver_server.extra["base"])
    client = resolver_server.client()
    assert _tokens(client, "org/nested", PROMPT_IDS[0]) == detok(references["mlp-o-r32"][0])
    assert _tokens(client, "link-in", PROMPT_IDS[0]) == detok(references["all-r8"][0])
    for name in ("link-out", "link-out/", "org/../link-out", "org/./nested", "org//nested", "./fs-adapter",
                 str(cache / "fs-adapter"), str(outside)):
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=name, prompt="x", max_tokens=1)
    roots = {m.id: m.root for m in client.models.list().data}
    assert roots["org/nested"] == os.path.realpath(cache / "org" / "nested")
    assert roots["link-in"] == os.path.realpath(cache / "fs-adapter")


def test_an_adapter_a_resolver_finds_but_cannot_load_leaves_the_name_to_the_next(resolver_server, llama, references,
                                                                                 detok):
    """As vLLM: when the adapter a resolver finds cannot be loaded, the next resolver is
    asked; only when none loads one is the request a 400, naming the reason."""
    _, adapters = llama
    table = resolver_server.extra["table"]
    entries = json.loads(table.read_text())
    entries["bad-in-table"] = str(table.parent / "no-adapter-here")  # example_lora_resolver: asked first
    table.write_text(json.dumps(entries))
    _copy_for(adapters["mlp-o-r32"], resolver_server.extra["cache"] / "bad-in-table",
              resolver_server.extra["base"])
    client = resolver_server.client()
    assert _tokens(client, "bad-in-table", PROMPT_IDS[0]) == detok(references["mlp-o-r32"][0])
    with pytest.raises(openai.BadRequestError) as info:  # found by one resolver only, and broken
        client.completions.create(model="broken", prompt="x", max_tokens=1)
    assert "LoRA adapter 'broken'" in info.value.body["message"]


def test_a_client_leaving_does_not_fail_the_others_waiting_for_its_resolution(resolver_server, llama, references,
                                                                               detok):
    """Requests for one unknown name wait for one resolution; the first one's client
    disconnecting must not cancel it under the others (they got a bare 500). The
    filesystem resolver is held inside its lookup by an adapter_config.json that is a FIFO:
    its open() waits for a writer, which the test becomes once the first client is gone."""
    import os
    import threading
    import time

    _, adapters = llama
    folder = _copy_for(adapters["all-r8"], resolver_server.extra["cache"] / "slow-to-find",
                       resolver_server.extra["base"])
    config = folder / "adapter_config.json"
    text = config.read_text()
    config.unlink()
    os.mkfifo(config)
    body = {"model": "slow-to-find", "prompt": PROMPT_IDS[0], "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True}
    url = f"{resolver_server.url}/v1/completions"
    second: dict = {}

    def wait_for_it() -> None:
        try:
            second["response"] = httpx.post(url, json=body, timeout=60)
        except Exception as exc:  # noqa: BLE001 -- reported below
            second["error"] = exc

    try:
        with pytest.raises(httpx.TimeoutException):
            waiter = threading.Thread(target=wait_for_it)  # the second request, once the first resolves
            threading.Timer(0.5, waiter.start).start()
            httpx.post(url, json=body, timeout=1.5)  # gives up: its client disconnects
        time.sleep(1.0)  # the server sees the disconnect and cancels the first request
    finally:
        deadline = time.monotonic() + 10
        while True:  # the resolver's open() waits for a writer: be it, with the real config
            try:
                fd = os.open(config, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        real = folder / "adapter_config.json.tmp"
        real.write_text(text)
        os.replace(real, config)  # what the server's own check reads next
        os.write(fd, text.encode())
        os.close(fd)
    waiter.join(60)
    assert "error" not in second, second.get("error")
    response = second["response"]
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"].rstrip("\ufffd") == detok(references["all-r8"][0])


def test_filesystem_resolver_is_a_filterable_plugin(plugin_site, tmp_path):
    from tests.conftest import plugin_env, run_forkless

    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model", FORKLESS_LORA_RESOLVER_CACHE_DIR=str(tmp_path))
    rows = {r["name"]: r for r in json.loads(run_forkless(["plugins", "list", "--json"], env).stdout)}
    assert rows["lora_filesystem_resolver"]["status"] == "filtered"
    assert rows["lora_filesystem_resolver"]["dist"] == "forkless"
    env = plugin_env(plugin_site, tmp_path, FORKLESS_LORA_RESOLVER_CACHE_DIR=str(tmp_path))
    rows = {r["name"]: r for r in json.loads(run_forkless(["plugins", "list", "--json"], env).stdout)}
    assert rows["lora_filesystem_resolver"]["status"] == "loaded"
    assert rows["example_lora_resolver"]["status"] == "loaded"


def test_resolver_registry_api():
    from forkless.lora import LoRARequest, LoRAResolver, LoRAResolverRegistry

    class Fixed(LoRAResolver):
        async def resolve_lora(self, base_model_name, lora_name):
            return LoRARequest(lora_name, 1, "/nowhere")

    resolver = Fixed()
    try:
        LoRAResolverRegistry.register_resolver("test_fixed", resolver)
        LoRAResolverRegistry.register_resolver("test_fixed", resolver)  # re-entrant
        assert LoRAResolverRegistry.get_resolver("test_fixed") is resolver
        assert "test_fixed" in LoRAResolverRegistry.get_supported_resolvers()
        with pytest.raises(KeyError, match="no LoRA resolver named 'nope'; registered: .*test_fixed"):
            LoRAResolverRegistry.get_resolver("nope")
        with pytest.raises(TypeError, match="expected a LoRAResolver"):
            LoRAResolverRegistry.register_resolver("bad", object())
    finally:
        LoRAResolverRegistry.unregister_resolver("test_fixed")


def test_metrics_have_lora_requests_info(lora_server):
    _tokens(lora_server.client(), "all", PROMPT_IDS[0])  # the worker loads an adapter on first use
    text = httpx.get(f"{lora_server.url}/metrics").text
    assert "forkless:lora_requests_info{" in text and 'max_lora="2"' in text
    loads = [line for line in text.splitlines() if line.startswith("forkless:lora_loads_total{")]
    assert loads and float(loads[0].rsplit(" ", 1)[1]) >= 1
    assert "forkless:lora_evictions_total{" in text
