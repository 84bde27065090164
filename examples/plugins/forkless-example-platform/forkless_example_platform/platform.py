"""A platform that runs on the CPU under its own name, with its own attention backend.

Its hooks are classmethods with vLLM's names and arguments, as on every forkless platform.
"""

from forkless.platforms.cpu import CpuPlatform
from forkless.platforms.interface import PlatformEnum

BACKEND_NAME = "example"
BACKEND_PATH = "forkless_example_platform.attention:ExampleAttentionBackend"
COMMUNICATOR_PATH = "forkless_example_platform.communicator:CountingGlooCommunicator"
SILU_AND_MUL_PATH = "forkless_example_platform.ops:ExampleSiluAndMul"


class ExampleCpuPlatform(CpuPlatform):
    _enum = PlatformEnum.OOT
    name = "example_cpu"
    device_name = "example CPU device"
    # The platform's own kernel needs no registration: it is selectable by name here.
    attention_backends = {BACKEND_NAME: BACKEND_PATH}
    default_attention_backend = BACKEND_NAME
    # Its own collectives for tensor parallelism (-tp): gloo that counts its calls.
    device_communicator_cls = COMMUNICATOR_PATH

    @classmethod
    def pre_register_and_update(cls, parser=None):
        # Every process, once the platform is chosen: by path, so that only the processes
        # that build a model import the op (the API server never imports torch).
        from forkless.ops import register_oot

        super().pre_register_and_update(parser)
        register_oot("silu_and_mul", SILU_AND_MUL_PATH)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        # Each worker asks once, with what the backend must handle.
        if attn_selector_config.use_mla:
            raise NotImplementedError("the example_cpu platform has no MLA kernel")
        return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
