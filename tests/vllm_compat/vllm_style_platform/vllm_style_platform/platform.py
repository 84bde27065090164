"""Two platforms written the way vLLM's out-of-tree platforms are, ``vllm`` renamed to
``forkless`` in the imports and nothing else.

* ``VllmStyleCpuPlatform`` subclasses the CPU platform, as a CPU-like plugin subclasses
  vLLM's, and chooses its worker and attention backend.
* ``DummyStylePlatform`` is vLLM's dummy platform plugin: it subclasses ``Platform``
  directly and only returns its attention backend. vLLM's says
  ``device_type = "privateuseone"``, a device torch cannot run here; this one is ``cpu``.

What they return is forkless's: the worker and the attention backend classes are written
against forkless's interfaces (see ``worker.py`` and ``attention.py``).
"""

from forkless.logger import init_logger
from forkless.platforms import Platform, PlatformEnum
from forkless.platforms.cpu import CpuPlatform

from vllm_style_platform._record import record

logger = init_logger(__name__)

WORKER = "vllm_style_platform.worker.VllmStyleWorker"
ATTENTION_BACKEND = "vllm_style_platform.attention.VllmStyleAttentionBackend"


def _record_selection(selected_backend, attn_selector_config, num_heads) -> None:
    record("get_attn_backend_cls", selected_backend=selected_backend,
           head_size=attn_selector_config.head_size, dtype=str(attn_selector_config.dtype),
           kv_cache_dtype=attn_selector_config.kv_cache_dtype, block_size=attn_selector_config.block_size,
           use_mla=attn_selector_config.use_mla, attn_type=attn_selector_config.attn_type, num_heads=num_heads)


class VllmStyleCpuPlatform(CpuPlatform):
    _enum = PlatformEnum.OOT
    device_name: str = "vllm-style-cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    supported_quantization: list[str] = []

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "VllmStyleCPU"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        parallel_config = vllm_config.parallel_config
        record("check_and_update_config", worker_cls=parallel_config.worker_cls)
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER
        super().check_and_update_config(vllm_config)

        cache_config = vllm_config.cache_config
        if cache_config.block_size % 16 != 0:
            raise ValueError(f"{cls.get_device_name()} needs a block size that is a multiple of 16, "
                             f"got {cache_config.block_size}")

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        _record_selection(selected_backend, attn_selector_config, num_heads)
        if attn_selector_config.use_mla:
            raise NotImplementedError("MLA is not supported on VllmStyleCPU.")
        if selected_backend is not None:
            logger.info("Cannot use %s backend on VllmStyleCPU.", selected_backend)
        return ATTENTION_BACKEND

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        logger.warning("Pin memory is not supported on VllmStyleCPU.")
        return False


class DummyStylePlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "DummyDevice"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        record("check_and_update_config", worker_cls=vllm_config.parallel_config.worker_cls)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        _record_selection(selected_backend, attn_selector_config, num_heads)
        return ATTENTION_BACKEND

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return 2 * 1024**3
