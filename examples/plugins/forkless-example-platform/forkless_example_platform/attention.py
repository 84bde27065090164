"""The example platform's own attention backend, shipped in the plugin package.

It is the reference paged attention plus a log line on its first forward pass, so a test
can see that the platform, not forkless, chose the kernel that ran.
"""

import logging

from forkless.attention.backends.torch_sdpa import TorchAttentionBackend

logger = logging.getLogger("forkless.example_platform")


class ExampleAttentionBackend(TorchAttentionBackend):
    name = "example_cpu"
    #: Forward calls in this process, over all layers.
    forward_calls = 0

    def forward(self, q, k, v, kv_cache, attn_metadata):
        cls = type(self)
        if cls.forward_calls == 0:
            logger.warning("example_cpu attention backend: first forward pass")
        cls.forward_calls += 1
        return super().forward(q, k, v, kv_cache, attn_metadata)
