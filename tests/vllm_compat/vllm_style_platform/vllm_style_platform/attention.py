"""The platform's attention backend. vLLM's backends do not run in forkless: a port's
``get_attn_backend_cls`` returns a ``forkless.attention.AttentionBackend`` subclass, here
the reference paged attention, recording its first forward pass in each process."""

from forkless.attention.backends.torch_sdpa import TorchAttentionBackend

from vllm_style_platform._record import record


class VllmStyleAttentionBackend(TorchAttentionBackend):
    name = "vllm_style"
    _ran = False

    def forward(self, q, k, v, kv_cache, attn_metadata):
        cls = type(self)
        if not cls._ran:
            cls._ran = True
            record("attention.forward")
        return super().forward(q, k, v, kv_cache, attn_metadata)
