"""Which backends let the model's rotary kernel store the keys and values (CPU side).

The fused store itself runs only on CUDA (tests/gpu/test_triton_attention.py compares it
with the backend's own store); here: the default declines, so every CPU backend and every
plugin backend keeps storing in ``forward``, and a backend that accepts without attending
``forward_stored`` is told what it lacks.
"""

from __future__ import annotations

import pytest
import torch

from forkless.attention import AttentionBackend, AttentionMetadata, KVStoreTarget, get_attention_backend


def _metadata() -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.tensor([3]), query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([4], dtype=torch.int32), block_tables=torch.tensor([[0]], dtype=torch.int32),
        max_query_len=1, max_seq_len=4, block_size=16)


@pytest.mark.parametrize("name", ["torch", "cpu"])
def test_cpu_backends_store_in_forward(name: str) -> None:
    backend = get_attention_backend(name)(4, 2, 8, 8**-0.5)
    cache = torch.zeros(backend.get_kv_cache_shape(2, 16, 2, 8))
    assert backend.kv_store_target(cache, _metadata()) is None


def test_a_backend_that_accepts_the_store_must_attend_without_it() -> None:
    class Half(AttentionBackend):
        @classmethod
        def get_kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_dim):
            return (2, num_blocks, block_size, num_kv_heads, head_dim)

        def forward(self, q, k, v, kv_cache, attn_metadata):
            raise AssertionError("not called")

        def kv_store_target(self, kv_cache, attn_metadata):
            return KVStoreTarget(kv_cache, attn_metadata.slot_mapping, 1.0, 1.0)

    backend = Half(4, 2, 8, 8**-0.5)
    with pytest.raises(NotImplementedError, match="Half returns a kv_store_target but does not implement"):
        backend.forward_stored(torch.zeros(1, 4, 8), torch.zeros(2, 2, 16, 2, 8), _metadata())
