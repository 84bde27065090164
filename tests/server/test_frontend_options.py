"""vLLM's front-end flags: CORS (--allowed-origins...), --root-path, TLS (--ssl-*),
--disable-fastapi-docs, --disable-uvicorn-access-log, --enable-request-id-headers, and
--config FILE (flags from YAML)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from forkless.entrypoints.cli.config_file import expand_config_file
from forkless.entrypoints.openai.frontend_options import FrontendOptions
from tests.server.conftest import Server, start_server, stop_and_check

GOOD_ORIGIN = "http://good.example"
KEY = "s3cret"


def _certificate(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    return key, cert


@pytest.fixture(scope="module")
def tls_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """TLS, CORS for one origin, a root path and an API key, all from a --config file; the
    command line's --max-logprobs wins over the file's."""
    tmp = tmp_path_factory.mktemp("frontend")
    key, cert = _certificate(tmp)
    config = tmp / "serve.yaml"
    config.write_text(f"""
ssl-keyfile: {key}
ssl_certfile: {cert}
allowed-origins: ["{GOOD_ORIGIN}"]
root-path: /llm
disable-fastapi-docs: true
disable-uvicorn-access-log: true
served-model-name: [first, second]
max-logprobs: 1
enable-prefix-caching: false
enable-request-id-headers: true
""")
    server = start_server(tiny_llama, tmp, "--config", str(config), "--max-logprobs", "3",
                          "--uvicorn-log-level", "info", api_key=KEY, scheme="https")
    yield server
    stop_and_check(server)


def _get(server: Server, path: str, **kwargs) -> httpx.Response:
    return httpx.get(server.url + path, verify=False, timeout=30, **kwargs)


def test_the_openai_client_talks_https(tls_server: Server) -> None:
    client = openai.OpenAI(base_url=tls_server.url + "/v1", api_key=KEY, max_retries=0,
                           http_client=httpx.Client(verify=False))
    assert [m.id for m in client.models.list().data] == ["first", "second"]
    out = client.completions.create(model="second", prompt="Hello", max_tokens=3, logprobs=3)
    assert len(out.choices[0].logprobs.tokens) == 3
    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):
        client.completions.create(model="first", prompt="Hello", max_tokens=3, logprobs=4)
    # Plain HTTP on the TLS port gets no answer from the API.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{tls_server.port}/health", timeout=5)
    log = tls_server.log()
    assert "https://127.0.0.1" in log and "/llm (OpenAI API at /llm/v1)" in log
    assert 'HTTP/1.1" 200' not in log  # --disable-uvicorn-access-log, at --uvicorn-log-level info


def test_cors_answers_the_allowed_origin_only(tls_server: Server) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = httpx.options(tls_server.url + "/v1/completions", verify=False,
                       headers={"Origin": GOOD_ORIGIN, **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == GOOD_ORIGIN
    bad = httpx.options(tls_server.url + "/v1/completions", verify=False,
                        headers={"Origin": "http://evil.example", **preflight})
    assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
    # The answers themselves carry the header, a refused key's 401 included (the page can
    # read why); another origin's do not.
    models = _get(tls_server, "/v1/models", headers={"Origin": GOOD_ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert models.headers["access-control-allow-origin"] == GOOD_ORIGIN
    assert _get(tls_server, "/v1/models", headers={"Origin": GOOD_ORIGIN}).status_code == 401
    other = _get(tls_server, "/v1/models", headers={"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"})
    assert "access-control-allow-origin" not in other.headers


def test_request_id_headers(tls_server: Server) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    given = _get(tls_server, "/v1/models", headers={**auth, "X-Request-Id": "mine"})
    assert given.headers["x-request-id"] == "mine"
    made = [_get(tls_server, "/v1/models", headers=auth).headers["x-request-id"] for _ in range(2)]
    assert len(set(made)) == 2 and all(len(m) == 32 for m in made)
    assert _get(tls_server, "/health").headers["x-request-id"]  # every answer has one


def test_docs_are_off_and_the_open_paths_stay_open_under_the_root_path(tls_server: Server) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert _get(tls_server, path, headers=auth).status_code == 404
    assert _get(tls_server, "/health").status_code == 200  # no key needed, as without --root-path
    assert _get(tls_server, "/v1/models").status_code == 401


def test_without_allowed_origins_there_are_no_cors_headers(tiny_llama: Path, tmp_path: Path) -> None:
    # vLLM allows every origin by default; forkless answers none unless asked.
    server = start_server(tiny_llama, tmp_path, "--root-path", "/llm", "--max-logprobs", "-1")
    try:
        r = httpx.options(server.url + "/v1/models", headers={"Origin": GOOD_ORIGIN,
                                                              "Access-Control-Request-Method": "GET"})
        assert "access-control-allow-origin" not in r.headers
        # --max-logprobs -1: a request's -1 gets the whole vocabulary, completions and chat.
        full = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "logprobs": -1},
                          timeout=60).json()["choices"][0]["logprobs"]["top_logprobs"][0]
        chat = httpx.post(server.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "logprobs": True, "top_logprobs": -1},
            timeout=60).json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert len(full) > 40000 and len(chat) > 40000  # SmolLM2's 49152 tokens (some decode alike)
        spec = httpx.get(server.url + "/openapi.json").json()
        assert spec["servers"] == [{"url": "/llm"}]  # the docs call the API through the proxy's prefix
    finally:
        stop_and_check(server)


def _serve_parser() -> argparse.ArgumentParser:
    from forkless.entrypoints.cli import serve

    subparsers = argparse.ArgumentParser().add_subparsers()
    serve.add_parser(subparsers)
    return subparsers.choices["serve"]


def test_config_file_becomes_flags_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model: /from/file\nmax_model_len: 512\nenable-prefix-caching: false\n"
                      "enforce-eager: true\nasync-scheduling: false\n"
                      "speculative-config: {method: ngram, num_speculative_tokens: 2}\n"
                      "served-model-name: [a, b]\n")
    parser = _serve_parser()
    argv = expand_config_file(["serve", "--config", str(config), "--max-model-len", "128"], parser)
    assert argv == ["serve", "--max-model-len", "128"]
    args = parser.parse_args(argv[1:])
    assert (args.model_option, args.max_model_len, args.enable_prefix_caching) == ("/from/file", 128, False)
    assert args.enforce_eager and not args.async_scheduling and args.served_model_name == ["a", "b"]
    assert json.loads(args.speculative_config) == {"method": "ngram", "num_speculative_tokens": 2}
    # MODEL on the command line wins over the file's model.
    parser = _serve_parser()
    argv = expand_config_file(["serve", f"--config={config}", "/cli/model"], parser)
    args = parser.parse_args(argv[1:])
    assert (args.model, args.model_option, args.served_model_name) == ("/cli/model", None, ["a", "b"])


@pytest.mark.parametrize(("text", "fragment"), [
    ("max-model-lenn: 5\n", "'max-model-lenn' is not a flag"),
    ("- a\n- b\n", "expected a mapping"),
    ("port: [1\n", "not valid YAML"),
    ("port:\n", "'port' has no value"),
    ("port: many\n", "--port: expected a port number in 0-65535, got 'many'"),
    ("disable-fastapi-docs: 0\n", "'disable-fastapi-docs' is a switch: expected true or false, got 0"),
    ("port: true\n", "'port' takes a value, not true"),
])
def test_bad_config_files_are_refused_naming_the_problem(tmp_path: Path, text: str, fragment: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and fragment in proc.stderr and str(config) in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", "--config",
                              str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "cannot read it" in missing.stderr
    twice = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", "--config", str(config),
                            f"--config={config}"], capture_output=True, text=True, timeout=120)
    assert twice.returncode == 2 and "--config is given 2 times" in twice.stderr


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"root_path": "llm"}, "--root-path 'llm'"),
    ({"root_path": "/llm/"}, "no trailing /"),
    ({"ssl_keyfile": "/k.pem"}, "both --ssl-keyfile and --ssl-certfile"),
    ({"ssl_keyfile": "/nonexistent/k.pem", "ssl_certfile": "/nonexistent/c.pem"}, "cannot be loaded"),
    ({"ssl_cert_reqs": 7}, "--ssl-cert-reqs 7"),
    ({"ssl_ca_certs": "/ca.pem"}, "need TLS"),
])
def test_bad_frontend_options_name_the_flag(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        FrontendOptions(**kwargs)


def test_origin_lists_take_vllm_s_json_or_one_bare_origin() -> None:
    parser = _serve_parser()
    for value, origins in (('["http://a", "http://b"]', ["http://a", "http://b"]), ("*", ["*"]),
                           ("http://a", ["http://a"])):
        args = parser.parse_args(["--allowed-origins", value])
        assert FrontendOptions.from_cli_args(args).allowed_origins == origins
    with pytest.raises(ValueError, match="JSON list of non-empty strings"):
        FrontendOptions.from_cli_args(parser.parse_args(["--allowed-origins", '[1, 2]']))
