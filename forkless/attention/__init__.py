"""Attention backends over the paged KV cache (provisional extension point).

Importing this package does not import torch or any kernel: backends are resolved lazily
by name in the worker that runs them.
"""

from forkless.attention.interface import AttentionBackend, AttentionMetadata, KVStoreTarget, attention_layers
from forkless.attention.registry import (
    attention_backend_path,
    available_attention_backends,
    get_attention_backend,
    register_attention_backend,
)

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "KVStoreTarget",
    "attention_backend_path",
    "attention_layers",
    "available_attention_backends",
    "get_attention_backend",
    "register_attention_backend",
]
