"""vLLM's spellings of forkless serve's flags: several served names, --model, human-readable
--max-model-len, --dtype's other names, --trust-remote-code, --response-role, --enable-log-requests."""

from __future__ import annotations

import argparse
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from forkless.config import EngineArgs
from tests.server.conftest import start_server, wait_until


def _parse(*argv: str) -> EngineArgs:
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    return EngineArgs.from_cli_args(parser.parse_args(list(argv)))


def test_the_flags_parse_as_vllm_reads_them(tiny_llama: Path) -> None:
    args = _parse("--model", str(tiny_llama), "--max-model-len", "0.256k", "--dtype", "float", "--trust-remote-code")
    config = args.create_engine_config()
    assert config.model_config.model == str(tiny_llama)
    assert config.model_config.max_model_len == 256 and config.model_config.dtype == "float32"
    assert _parse(str(tiny_llama), "--model", str(tiny_llama)).model == str(tiny_llama)
    with pytest.raises(ValueError, match="disagree"):
        _parse(str(tiny_llama), "--model", "/elsewhere")
    for text, tokens in (("4k", 4000), ("4K", 4096), ("25.6k", 25600), ("-1", None), ("auto", None), ("512", 512)):
        assert _parse(str(tiny_llama), "--max-model-len", text).max_model_len == tokens
    with pytest.raises(SystemExit):
        _parse(str(tiny_llama), "--max-model-len", "lots")
    # vLLM's human_readable_int for the token budget and the KV-cache bytes too; a decimal
    # before a binary suffix is refused, as vLLM refuses it.
    args = _parse(str(tiny_llama), "--max-num-batched-tokens", "8k", "--kv-cache-memory-bytes", "64M")
    assert (args.max_num_batched_tokens, args.kv_cache_memory_bytes) == (8000, 64 << 20)
    assert _parse(str(tiny_llama), "--kv-cache-memory", "1G").kv_cache_memory == 1 << 30
    for flag, text in (("--max-model-len", "0.25K"), ("--max-num-batched-tokens", "0"),
                       ("--kv-cache-memory-bytes", "lots")):
        with pytest.raises(SystemExit):
            _parse(str(tiny_llama), flag, text)
    assert EngineArgs(model=str(tiny_llama), dtype="half").create_engine_config().model_config.dtype == "float16"
    assert EngineArgs(model=str(tiny_llama), max_model_len=-1).create_engine_config().model_config.max_model_len > 0
    assert _parse(str(tiny_llama), "--max-logprobs", "-1").create_engine_config().model_config.max_logprobs == -1
    assert _parse(str(tiny_llama)).create_engine_config().model_config.max_logprobs == 20
    with pytest.raises(ValueError, match="--max-logprobs=-2"):
        _parse(str(tiny_llama), "--max-logprobs", "-2").create_engine_config()


def test_every_served_name_is_accepted_and_the_first_reported(tiny_llama: Path, tmp_path: Path) -> None:
    template = tmp_path / "parts.jinja"  # renders a content given as parts, part by part
    template.write_text("{% for m in messages %}<|{{ m.role }}|>{% if m.content is string %}{{ m.content }}"
                        "{% else %}{% for p in m.content %}[part:{{ p.text }}]{% endfor %}{% endif %}\n"
                        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    server = start_server(tiny_llama, tmp_path, "--served-model-name", "alpha", "beta", "--response-role", "bot",
                          "--chat-template", str(template),
                          "--enable-log-requests", "--uvicorn-log-level", "info", "--enable-force-include-usage",
                          "--max-log-len", "100", "--chat-template-content-format", "openai",
                          "--enable-server-load-tracking")
    try:
        # --response-role names the reply after a generation prompt; a continued message keeps its role.
        def chat(stream: bool = False, **body) -> list[str]:
            r = httpx.post(server.url + "/v1/chat/completions", json={
                "model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": stream,
                **body}, timeout=60)
            assert r.status_code == 200, r.text
            if not stream:
                return [r.json()["choices"][0]["message"]["role"]]
            return [line for line in r.text.splitlines() if '"role"' in line]

        assert chat() == ["bot"]
        assert chat(add_generation_prompt=False) == ["user"]
        assert '"role":"bot"' in chat(stream=True)[0].replace(" ", "")
        # --chat-template-content-format openai: the template gets each content as a list of
        # text parts.
        ids = httpx.post(server.url + "/tokenize", json={"model": "alpha", "messages": [
            {"role": "user", "content": "Hi"}]}, timeout=60).json()["tokens"]
        rendered = httpx.post(server.url + "/detokenize", json={"model": "alpha", "tokens": ids}, timeout=60)
        assert "<|user|>[part:Hi]" in rendered.json()["prompt"], rendered.text
        # --enable-force-include-usage: a stream that did not ask for its usage ends with it,
        # and (vLLM's rule) its chunks carry the usage so far, as continuous_usage_stats does.
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                           ("/v1/completions", {"prompt": "Hi"})):
            r = httpx.post(server.url + path, json={"model": "alpha", "max_tokens": 2, "stream": True, **body},
                           timeout=60)
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2, r.text
            # (Every chunk has it; how many chunks the two tokens come in depends on timing:
            # a server that falls behind merges steps into one chunk.)
            counts = [e["usage"]["completion_tokens"] for e in events[:-1] if e.get("usage")]
            assert len(counts) == len(events) - 1 and counts == sorted(counts) and counts[-1] == 2, r.text
        models = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models][:2] == ["alpha", "beta"]
        for name in ("alpha", "beta"):
            r = httpx.post(server.url + "/v1/completions",
                           json={"model": name, "prompt": "Hi", "max_tokens": 2}, timeout=60)
            assert r.status_code == 200 and r.json()["model"] == "alpha", r.text
        r = httpx.post(server.url + "/v1/completions", json={"model": "gamma", "prompt": "Hi", "max_tokens": 2},
                       timeout=60)
        assert r.status_code == 404, r.text
        # --enable-log-requests: a line per engine request (four chats, three completions), with its parameters.
        logged = [line for line in server.log().splitlines() if "forkless.entrypoints.openai: request " in line]
        assert len(logged) == 7 and all("prompt tokens, SamplingParams(" in line for line in logged), logged
        # ... and one when a request is aborted (its client went away), as vLLM's.
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
                "model": "alpha", "prompt": "Hi", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
            next(line for line in r.iter_lines() if line.startswith("data: {"))
        assert wait_until(lambda: "aborted request(s) cmpl-" in server.log()), server.log()[-2000:]
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def test_vllms_other_engine_arguments_are_taken_or_refused_saying_why(tiny_llama: Path) -> None:
    # vLLM scripts pass these; the values that ask for what forkless does are accepted.
    config = EngineArgs(model=str(tiny_llama), trust_remote_code=True, tokenizer_mode="auto", swap_space=4,
                        cpu_offload_gb=0, disable_custom_all_reduce=True, kv_cache_memory_bytes=1 << 24,
                        ).create_engine_config()
    assert config.cache_config.kv_cache_memory == 1 << 24
    assert _parse(str(tiny_llama), "--kv-cache-memory-bytes", "1000000", "-dp", "1", "--swap-space", "0",
                  "--tokenizer-mode", "auto").create_engine_config().cache_config.kv_cache_memory == 1000000
    for argv, fragment in ((["--revision", "main"], "--revision='main' is invalid: expected none"),
                           (["--tokenizer-mode", "mistral"], "--tokenizer-mode='mistral'"),
                           (["-dp", "2"], "--data-parallel-size=2 is invalid: expected 1"),
                           (["--cpu-offload-gb", "8"], "--cpu-offload-gb=8.0"),
                           (["--skip-tokenizer-init"], "--skip-tokenizer-init=True")):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            _parse(str(tiny_llama), *argv).create_engine_config()


def test_vllms_underscore_and_dotted_flag_spellings_reach_the_flags_they_name(capsys) -> None:
    from forkless.entrypoints.cli.flexible_args import normalize_argv
    from forkless.entrypoints.cli.main import _subparsers, build_parser, main

    argv = ["serve", "m", "--max_model_len", "64", "--speculative-config", '{"method": "ngram", "prompt_lookup_max": 4}',
            "--speculative-config.num_speculative_tokens", "3", "--speculative_config.prompt_lookup_max=5",
            "--kv-transfer-config.kv_connector", "SharedStorageConnector",
            "--kv-transfer-config.kv_connector_extra_config.shared_storage_path", "/tmp/kv",
            "--port.x+", "a,b"]
    parser = build_parser(argv)
    with pytest.raises(ValueError, match="--port takes no JSON object"):
        normalize_argv(argv, _subparsers(parser)["serve"])
    args = parser.parse_args(normalize_argv(argv[:-2], _subparsers(parser)["serve"]))
    assert args.max_model_len == 64
    assert json.loads(args.speculative_config) == {"method": "ngram", "prompt_lookup_max": 5,
                                                   "num_speculative_tokens": 3}
    assert json.loads(args.kv_transfer_config) == {
        "kv_connector": "SharedStorageConnector", "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}
    # Values are JSON where they are JSON, text otherwise, and never rewritten; nor is
    # anything after a bare "--".
    assert normalize_argv(["--served_model_name", "a_b", "--pooler-config.normalize", "false"],
                          _subparsers(parser)["serve"]) == [
        "--served-model-name", "a_b", "--pooler-config", '{"normalize": false}']
    assert normalize_argv(["--", "--max_model_len"], _subparsers(parser)["serve"]) == ["--", "--max_model_len"]
    # A bad dotted flag is one line naming it, exit status 2, before anything starts.
    for bad, fragment in ((["--speculative-config.method"], "--speculative-config.method needs a value"),
                          (["--speculative-config.n", "1", "--speculative-config.n", "2"], "given twice"),
                          (["--no-such-flag.key", "1"], "unknown flag --no-such-flag")):
        assert main(["serve", "m", *bad]) == 2
        assert fragment in capsys.readouterr().err


def test_vllms_dev_routes_sleep_wake_pause_and_reset_the_engine(tiny_llama: Path, tmp_path: Path) -> None:
    server = start_server(tiny_llama, tmp_path, "--enable-sleep-mode", env_extra={"FORKLESS_SERVER_DEV_MODE": "1"})
    try:
        def post(path: str, **kw) -> httpx.Response:
            return httpx.post(server.url + path, timeout=60, **kw)

        def complete() -> httpx.Response:
            return post("/v1/completions", json={"model": str(tiny_llama), "prompt": "Paris is", "max_tokens": 6,
                                                 "temperature": 0})

        before = complete().json()["choices"][0]["text"]
        assert post("/reset_prefix_cache").json() == {"success": True}
        assert httpx.get(server.url + "/is_sleeping", timeout=10).json() == {"is_sleeping": False}
        # /sleep ends what is in flight first (vLLM's mode=abort): the stream ends "abort".
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
                "model": str(tiny_llama), "prompt": "Hi", "max_tokens": 250, "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            assert post("/sleep", params={"level": 2}).json() == {"status": "sleeping", "level": 2}
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert rest[-1]["choices"][0]["finish_reason"] == "abort"
        assert httpx.get(server.url + "/is_sleeping", timeout=10).json() == {"is_sleeping": True}
        with ThreadPoolExecutor(1) as pool:
            asleep = pool.submit(complete)  # taken; it waits for the wake-up
            for path, params, status, fragment in (
                    ("/sleep", {}, 409, "sleeps already"),
                    ("/sleep", {"mode": "keep"}, 400, "mode='keep' with sleep level 1"),
                    ("/sleep", {"level": 3}, 400, "level=3 is invalid"),
                    ("/sleep", {"level": 10 ** 20}, 400, "64-bit integers"),  # (msgpack's limit, not a 500)
                    ("/sleep", {"level": "abc"}, 400, "level: Input should be a valid integer, unable to parse "
                                                      "string as an integer"),  # (no word of a JSON body)
                    ("/resume", {"now": 1}, 400, "unknown query parameter 'now' for /resume"),
                    ("/sleep", [("mode", "abort"), ("mode", "wait")], 400, "'mode' is given 2 times"),
                    ("/resume", {}, 409, "call wake_up()"),
                    ("/wake_up", {"tags": "bogus"}, 400, "'bogus'"),
                    ("/wake_up", {"tags": "kv_cache"}, 409, "wake 'weights' first")):
                r = post(path, params=params)
                assert r.status_code == status and fragment in r.json()["error"]["message"], (path, params, r.text)
                assert "JSON" not in r.json()["error"]["message"]
            assert post("/wake_up", params={"tags": "weights"}).json() == {"status": "sleeping", "tags": ["weights"]}
            assert not asleep.done()
            assert post("/wake_up").json() == {"status": "awake", "tags": None}
            # Weights and cache back as they were.
            assert asleep.result(timeout=60).json()["choices"][0]["text"] == before
        assert post("/wake_up").status_code == 409
        # vLLM's RL routes: /pause (mode=keep: frozen, then resumed), /is_paused, /resume.
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
                "model": str(tiny_llama), "prompt": "Hi", "max_tokens": 60, "ignore_eos": True, "stream": True,
                "temperature": 0}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            assert post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
            assert httpx.get(server.url + "/is_paused", timeout=10).json() == {"is_paused": True}
            for params, fragment in (({"mode": "bogus"}, "mode='bogus' is invalid"),):
                r = post("/pause", params=params)
                assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
            assert post("/resume").json() == {"status": "resumed"}
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert rest[-1]["choices"][0]["finish_reason"] == "length"
        assert httpx.get(server.url + "/is_paused", timeout=10).json() == {"is_paused": False}
        # /abort_requests: by the client's id (X-Request-Id) or the response id; none: all.
        # (Sent while paused, the requests wait, counted as waiting, until the resume.)
        def stream(request_id: str) -> tuple[str, str]:
            with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                              headers={"X-Request-Id": request_id}, json={
                                  "model": str(tiny_llama), "prompt": "Hi", "max_tokens": 20,
                                  "ignore_eos": True, "stream": True}) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            return chunks[0]["id"], chunks[-1]["choices"][0]["finish_reason"]

        with ThreadPoolExecutor(2) as pool:
            post("/pause", params={"mode": "keep"})
            kept, ended = pool.submit(stream, "keep-me"), pool.submit(stream, "end-me")
            wait_until(lambda: _gauge(server, "num_requests_waiting") == 2, timeout=60)
            assert post("/abort_requests", json={"request_ids": ["end-me", "nobody"]}).json() == {
                "status": "aborted", "aborted": 1}
            post("/resume")
            assert ended.result(timeout=60) == ("cmpl-end-me", "abort")
            assert kept.result(timeout=60) == ("cmpl-keep-me", "length")
            post("/pause", params={"mode": "keep"})
            ended = pool.submit(stream, "again")
            wait_until(lambda: _gauge(server, "num_requests_waiting") == 1, timeout=60)
            assert post("/abort_requests").json() == {"status": "aborted", "aborted": 1}
            post("/resume")
            assert ended.result(timeout=60)[1] == "abort"
        for body, fragment in (({"request_ids": "end-me"}, "request_ids"), ({"ids": []}, "argument supplied: ids")):
            r = post("/abort_requests", json=body)
            assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def _gauge(server, name: str) -> int:
    """The server's ``forkless:<name>`` gauge."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    line = next(line for line in text.splitlines() if line.startswith(f"forkless:{name}{{"))
    return int(float(line.rsplit(" ", 1)[1]))
