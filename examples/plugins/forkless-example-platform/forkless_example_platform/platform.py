"""A platform that runs on the CPU under its own name, with its own attention backend."""

from forkless.platforms.cpu import CpuPlatform

BACKEND_NAME = "example"
BACKEND_PATH = "forkless_example_platform.attention:ExampleAttentionBackend"


class ExampleCpuPlatform(CpuPlatform):
    name = "example_cpu"
    device_name = "example CPU device"
    default_attention_backend = BACKEND_NAME

    def get_attn_backend_cls(self, selected_backend=None, **kwargs):
        # The platform's own kernel needs no registration: the platform hands out its path.
        if self.resolved_attention_backend(selected_backend) == BACKEND_NAME:
            return BACKEND_PATH
        return super().get_attn_backend_cls(selected_backend, **kwargs)
