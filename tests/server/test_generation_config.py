"""Sampling defaults from the model's generation config (vLLM's ``--generation-config auto``):
requests that set no sampling field sample as the model's creator recommends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from forkless import LLM, SamplingParams
from forkless.config import EngineArgs
from forkless.entrypoints.openai.serving import to_sampling_params
from forkless.protocol.openai import CompletionRequest
from tests.server.conftest import start_server

# top_k=1: sampling at any temperature is greedy, so "the defaults took effect" shows in text.
RECOMMENDED = {"temperature": 0.7, "top_k": 1, "top_p": 0.9, "repetition_penalty": 1.0, "max_new_tokens": 6,
               "do_sample": True}


@pytest.fixture(scope="module")
def recommending(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with sampling recommendations in its generation_config.json."""
    out = tmp_path_factory.mktemp("recommending") / "model"
    shutil.copytree(tiny_llama, out)
    config = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**config, **RECOMMENDED}))
    return out


def _defaults(model: Path, **kwargs) -> dict:
    return EngineArgs(model=str(model), max_model_len=256, **kwargs).create_engine_config().model_config.sampling_defaults


def test_the_defaults_come_from_the_generation_config_and_its_overrides(recommending: Path, tiny_llama: Path,
                                                                          tmp_path: Path) -> None:
    assert _defaults(recommending) == {"temperature": 0.7, "top_k": 1, "top_p": 0.9, "repetition_penalty": 1.0,
                                       "max_tokens": 6}
    assert _defaults(recommending, generation_config="vllm") == {}
    assert _defaults(tiny_llama, generation_config=str(recommending))["top_k"] == 1
    assert _defaults(recommending, generation_config="vllm", override_generation_config='{"temperature": 0.2}') == \
        {"temperature": 0.2}
    assert _defaults(recommending, override_generation_config={"top_k": 5})["top_k"] == 5
    with pytest.raises(ValueError, match="--generation-config .*expected 'auto', 'vllm' or a folder"):
        _defaults(recommending, generation_config=str(tmp_path))
    with pytest.raises(ValueError, match="--override-generation-config: 'do_sample' is not a sampling default"):
        _defaults(recommending, override_generation_config={"do_sample": True})
    with pytest.raises(ValueError, match="top_p"):
        _defaults(recommending, override_generation_config={"top_p": 2.0})
    # The flags, as forkless serve parses them.
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args([str(recommending), "--generation-config", "vllm",
                                                       "--override-generation-config", '{"min_p": 0.05}']))
    assert args.create_engine_config().model_config.sampling_defaults == {"min_p": 0.05}


def test_a_request_fills_only_what_it_leaves_out() -> None:
    defaults = {"temperature": 0.7, "top_k": 1, "max_tokens": 6}
    plain = to_sampling_params(CompletionRequest(prompt="x", max_tokens=None), None, None, 100, defaults=defaults)
    assert (plain.temperature, plain.top_k, plain.top_p, plain.max_tokens) == (0.7, 1, 1.0, 6)
    own = to_sampling_params(CompletionRequest(prompt="x", temperature=0.0, top_k=3, max_tokens=9), 9, None, 100,
                             defaults=defaults)
    assert (own.temperature, own.top_k, own.max_tokens) == (0.0, 3, 9)
    # The model's max_new_tokens never lets a request run past the context.
    assert to_sampling_params(CompletionRequest(prompt="x", max_tokens=None), None, None, 4,
                              defaults=defaults).max_tokens == 4


def test_offline_generate_without_params_uses_the_defaults(recommending: Path) -> None:
    llm = LLM(str(recommending), max_model_len=256, kv_cache_memory=1 << 24)
    try:
        default = llm.get_default_sampling_params()
        assert (default.temperature, default.top_k, default.top_p, default.max_tokens) == (0.7, 1, 0.9, 6)
        got = llm.generate(["Hello there"] * 3, use_tqdm=False)
        greedy = llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
        assert [list(o.outputs[0].token_ids) for o in got] == [list(greedy.outputs[0].token_ids)] * 3
    finally:
        llm.shutdown()


def test_the_server_samples_with_the_models_defaults_unless_told_otherwise(recommending: Path,
                                                                           tmp_path: Path) -> None:
    server = start_server(recommending, tmp_path, "--served-model-name", "tiny")
    try:
        def complete(**body) -> dict:
            r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "Hello there", **body},
                           timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        greedy = complete(temperature=0, max_tokens=6)
        # No sampling fields: top_k=1 from the generation config makes every answer greedy's
        # (completions' max_tokens is 16 when left out or null, as vLLM; chat's default
        # length is the config's max_new_tokens=6).
        for _ in range(3):
            assert complete(max_tokens=6) == greedy
        assert complete(max_tokens=None, ignore_eos=True)["text"].startswith(greedy["text"])
        chat = httpx.post(server.url + "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}, timeout=60).json()
        assert chat["usage"]["completion_tokens"] <= 6
    finally:
        assert server.stop() == 0, server.log()[-3000:]
