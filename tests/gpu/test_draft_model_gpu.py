"""``draft_model`` on the GPU (Triton backend): greedy outputs equal plain decoding with the
model as its own draft (every guess accepted), eager and with the target's verification
steps in CUDA graphs (the draft runs eagerly), and its cache is taken out of the KV
budget."""

from __future__ import annotations

import pytest

from tests.gpu.test_spec_decode_gpu import _run


@pytest.fixture(scope="module")
def reference(real_size_model):
    return _run(real_size_model, enforce_eager=True)[0]


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_draft_model_greedy_equals_plain_decoding(real_size_model, reference, eager):
    spec = {"method": "draft_model", "model": str(real_size_model), "num_speculative_tokens": 3}
    tokens, (runner, stats) = _run(real_size_model, enforce_eager=eager, speculative_config=spec)
    assert tokens == reference
    assert stats is not None and stats.num_drafts > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    # Target and draft caches share the budget: the draft's share is in every block.
    assert runner.bytes_per_block == 2 * runner.proposer.kv_bytes_per_block()
    assert runner.kv_reserved_bytes > 0
    if not eager:
        assert runner.graphs is not None and runner.graphs.spec_replays > 0
