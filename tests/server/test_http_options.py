"""``--middleware``, ``--api-key`` and ``--logits-processors`` by path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from tests.conftest import plugin_env
from tests.server.conftest import Server, start_server, stop_and_check
from tests.server.test_plugins_in_server import check_force_token_processor

MIDDLEWARE = '''
class AddHeader:
    """A plain ASGI middleware: stamps every HTTP response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def stamped(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-served-by", b"test-middleware")]
            await send(message)

        await self.app(scope, receive, stamped)


async def one_argument(request):
    """Not middleware: Starlette calls an HTTP middleware function with (request, call_next)."""
'''
PROCESSOR = "forkless_example_logits_processor:ForceTokenLogitsProcessor"


def middleware_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "mw"
    folder.mkdir(exist_ok=True)
    (folder / "h4_test_middleware.py").write_text(MIDDLEWARE)
    return folder


@pytest.fixture(scope="module")
def options_server(tiny_llama: Path, plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("options-server")
    pythonpath = os.pathsep.join([str(middleware_dir(tmp)), str(plugin_site)])
    srv = start_server(tiny_llama, tmp, "--served-model-name", "tiny",
                       "--middleware", "h4_test_middleware:AddHeader", "--logits-processors", PROCESSOR,
                       "--scheduler-cls", "forkless_example_scheduler:ShortPromptScheduler",
                       env_extra={"PYTHONPATH": pythonpath}, api_key="s3cret")
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_a_custom_internal_class_is_warned_about_once(options_server: Server) -> None:
    # The API server checks the class and the engine core builds it: one warning, not two.
    assert options_server.log().count("selects the custom class forkless_example_scheduler.ShortPromptScheduler") \
        == 1, options_server.log()[-3000:]


def test_middleware_adds_a_header(options_server: Server) -> None:
    assert httpx.get(options_server.url + "/health", timeout=30).headers["x-served-by"] == "test-middleware"
    raw = options_server.client().completions.with_raw_response.create(model="tiny", prompt="hi", max_tokens=2)
    assert raw.headers["x-served-by"] == "test-middleware"


# FORKLESS_API_KEY, and the key on every route (plugins' and the docs included):
# tests/security/test_http_limits.py.
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}])
def test_api_key_is_required_on_v1(options_server: Server, headers: dict) -> None:
    for method, path, body in [("GET", "/v1/models", None),
                               ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi"}),
                               ("POST", "/tokenize", {"prompt": "hi"}), ("GET", "/openapi.json", None)]:
        resp = httpx.request(method, options_server.url + path, json=body, headers=headers, timeout=30)
        assert resp.status_code == 401, resp.text
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and "API key" in error["message"]
    assert httpx.get(options_server.url + "/health", timeout=30).status_code == 200
    assert httpx.get(options_server.url + "/ping", timeout=30).status_code == 200  # vLLM's SageMaker probe
    assert httpx.post(options_server.url + "/invocations", json={"model": "tiny", "prompt": "hi"},
                      headers=headers, timeout=30).status_code == 401


def test_official_client_with_and_without_key(options_server: Server) -> None:
    assert [m.id for m in options_server.client().models.list().data] == ["tiny"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=options_server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_logits_processor_by_class_path(options_server: Server) -> None:
    check_force_token_processor(options_server, "tiny")


@pytest.mark.parametrize(("value", "fragment"), [
    ("h4_no_such_module:Middleware", "h4_no_such_module"),
    ("h4_test_middleware:Missing", "has no attribute 'Missing'"),
    ("h4_test_middleware", "class path"),
    ("h4_test_middleware:one_argument", "cannot be called as an async function (request, call_next)"),
])
def test_bad_middleware_path_fails_at_startup(tiny_llama: Path, tmp_path: Path, value: str, fragment: str) -> None:
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="", PYTHONPATH=str(middleware_dir(tmp_path)))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama),
                           "--port", "0", "--middleware", value], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert f"--middleware {value!r}" in proc.stderr and fragment in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60  # rejected before the model is loaded, not after
