"""The example platform plugin's own silu_and_mul replaces forkless's where that platform is
active, and greedy outputs are the same whichever implementation of the ops runs.

Each case is a fresh process (an offline ``LLM``, its worker in the same process) with the
example plugins installed for real in a site directory, so the platform is chosen by its
entry point as on a user's machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import plugin_env, run_python

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
NUM_LAYERS = 2  # tests/conftest.py make_tiny_model

SCRIPT = """
import json, sys
from forkless import LLM, SamplingParams
from forkless.platforms import current_platform
from forkless.plugins import load_general_plugins

load_general_plugins()
llm = LLM({model!r}, max_model_len=128, kv_cache_memory=32 << 20)
params = SamplingParams(temperature=0.0, max_tokens={max_tokens}, ignore_eos=True)
prompts = [{{"prompt_token_ids": [5, 17, 99, 3, 250]}}, {{"prompt_token_ids": [7, 7, 1000]}}]
outs = llm.generate(prompts, params, use_tqdm=False)
op = sys.modules.get("forkless_example_platform.ops")
print("RESULT", json.dumps({{
    "platform": current_platform.name,
    "tokens": [list(o.outputs[0].token_ids) for o in outs],
    "calls": op.ExampleSiluAndMul.calls if op else None,
}}))
llm.shutdown()
"""


def _run(model: Path, site: Path, tmp_path: Path, **env: str) -> dict:
    proc = run_python(SCRIPT.format(model=str(model), max_tokens=MAX_TOKENS),
                      plugin_env(site, tmp_path, **env), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return {**json.loads(line[len("RESULT "):]), "log": proc.stderr}


@pytest.fixture(scope="module")
def runs(tiny_llama: Path, plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("ops")
    return {
        "cpu": _run(tiny_llama, plugin_site, tmp),
        "native": _run(tiny_llama, plugin_site, tmp, FORKLESS_FUSED_KERNELS="0"),
        "example": _run(tiny_llama, plugin_site, tmp, FORKLESS_EXAMPLE_PLATFORM="1"),
        "example, -silu_and_mul": _run(tiny_llama, plugin_site, tmp, FORKLESS_EXAMPLE_PLATFORM="1",
                                       FORKLESS_CUSTOM_OPS="-silu_and_mul"),
    }


def test_example_platform_runs_its_own_silu_and_mul(runs):
    example = runs["example"]
    assert example["platform"] == "example_cpu"
    # One call per layer per forward pass, and at least one pass per generated token.
    assert example["calls"] >= NUM_LAYERS * MAX_TOKENS, example["calls"]
    assert example["calls"] % NUM_LAYERS == 0, example["calls"]
    assert "example_cpu silu_and_mul: first call" in example["log"]


def test_custom_ops_can_turn_the_platforms_op_off(runs):
    off = runs["example, -silu_and_mul"]
    assert off["platform"] == "example_cpu"
    assert off["calls"] == 0  # its class was built, but runs forward_native


def test_without_the_platform_its_op_is_not_even_imported(runs):
    assert runs["cpu"]["platform"] == "cpu"
    assert runs["cpu"]["calls"] is None
    assert "example_cpu silu_and_mul" not in runs["cpu"]["log"]


def test_greedy_outputs_do_not_depend_on_the_implementation(runs):
    tokens = runs["native"]["tokens"]
    assert [len(t) for t in tokens] == [MAX_TOKENS, MAX_TOKENS]
    assert runs["cpu"]["tokens"] == tokens  # C kernels vs PyTorch ops
    assert runs["example"]["tokens"] == tokens  # the platform's op
    assert runs["example, -silu_and_mul"]["tokens"] == tokens
