"""Speculative decoding through the server: the example proposer plugin (installed as a
real package) selected by name with ``--speculative-config``, the official ``openai``
client, greedy output equal to the offline engine without speculation, and vLLM's
counters on ``/metrics``."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from forkless.entrypoints.llm import LLM
from forkless.sampling_params import SamplingParams
from tests.server.conftest import start_server, stop_and_check

PROMPTS = ["one two three one two three one two three one two", "The capital of France is Paris. The capital of"]


def test_example_proposer_plugin_through_the_server(tiny_llama: Path, plugin_site: Path, tmp_path: Path) -> None:
    reference = LLM(str(tiny_llama), max_model_len=512)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    expected = [o.outputs[0].text for o in reference.generate(PROMPTS, params, use_tqdm=False)]
    reference.shutdown()
    # vLLM's dotted spelling of a JSON flag, and a flag with underscores, as a user ports them.
    srv = start_server(tiny_llama, tmp_path, "--max_model_len", "512", "--speculative-config.method",
                       "example_bigram", "--speculative_config.num_speculative_tokens", "3",
                       site=plugin_site, env_extra={"FORKLESS_PLUGINS": "example_proposer"})
    try:
        client = srv.client()
        for prompt, want in zip(PROMPTS, expected):
            got = client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=32,
                                            temperature=0, extra_body={"ignore_eos": True})
            assert got.choices[0].text == want
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text

        def value(name: str) -> float:
            m = re.search(rf"^{name}_total\{{[^}}]*\}} (\S+)$", metrics, re.M)
            assert m, f"{name} missing from /metrics"
            return float(m[1])

        drafts = value("forkless:spec_decode_num_drafts")
        accepted = value("forkless:spec_decode_num_accepted_tokens")
        assert drafts > 0 and 0 < accepted <= value("forkless:spec_decode_num_draft_tokens")
        assert 'forkless:spec_decode_num_accepted_tokens_per_pos_total{' in metrics
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_unknown_method_fails_at_start_and_lists_the_registered(tiny_llama: Path, plugin_site: Path,
                                                               tmp_path: Path) -> None:
    from tests.conftest import plugin_env, run_forkless

    proc = run_forkless(["serve", str(tiny_llama), "--speculative-config",
                         '{"method": "eagle42", "num_speculative_tokens": 2}'],
                        plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_proposer"), timeout=120)
    assert proc.returncode != 0
    assert "eagle42" in proc.stderr and "example_bigram" in proc.stderr and "ngram" in proc.stderr
