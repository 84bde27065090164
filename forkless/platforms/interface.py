"""The ``Platform`` interface (provisional tier): what a device must tell forkless.

A new device is a platform plugin: a ``Platform`` subclass that supplies the worker
class, the attention backend and the device communicator, while the scheduler and the
KV cache manager are reused unchanged.

Invariants:

* The class is the platform. Every hook that vLLM declares as a classmethod is one here,
  with vLLM's name and arguments, so a platform written for vLLM overrides them
  unchanged once its imports are renamed; ``current_platform`` is an instance, and a
  call on it is the same call.
* forkless calls a subset of the hooks (docs/plugins.md §3.2 lists them); the others
  keep vLLM's defaults so that ported code which overrides or calls them runs.
* forkless's own names (``name``, ``default_attention_backend``, ``attention_backends``,
  ``worker_cls``, ``total_memory_bytes``, ``free_memory_bytes``, ``torch_device``,
  ``is_available``) default to values derived from vLLM's, so a vLLM-style platform
  needs none of them.
* Importing this module imports no torch: the API server resolves the platform too and
  stays torch-free. Methods that need torch import it themselves.
"""

from __future__ import annotations

import enum
import os
import platform as _host
import random
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NamedTuple

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    import torch


class PlatformEnum(enum.Enum):
    """Which kind of device a platform drives (vLLM's ``PlatformEnum``)."""

    CUDA = enum.auto()
    ROCM = enum.auto()
    TPU = enum.auto()
    XPU = enum.auto()
    CPU = enum.auto()
    OOT = enum.auto()  # out of tree: a platform plugin's own device
    UNSPECIFIED = enum.auto()


class CpuArchEnum(enum.Enum):
    """The host CPU's architecture family (vLLM's ``CpuArchEnum``)."""

    X86 = enum.auto()
    ARM = enum.auto()
    POWERPC = enum.auto()
    S390X = enum.auto()
    RISCV = enum.auto()
    OTHER = enum.auto()
    UNKNOWN = enum.auto()


class DeviceCapability(NamedTuple):
    """A device's compute capability, ``(major, minor)``; compares as a tuple."""

    major: int
    minor: int

    def as_version_str(self) -> str:
        return f"{self.major}.{self.minor}"

    def to_int(self) -> int:
        """``<major><minor>`` as one integer (``(8, 9)`` -> 89); the minor is one digit."""
        assert 0 <= self.minor < 10
        return self.major * 10 + self.minor


class AttentionSelectorConfig(NamedTuple):
    """What ``Platform.get_attn_backend_cls`` chooses a backend by (vLLM's fields).

    forkless fills the fields it knows and leaves the others at the value that asks for
    nothing: it runs decoder-only models without MLA, attention sinks or sparse attention.

    Attributes:
        head_size: Per-head dimension of the model's attention.
        dtype: The ``torch.dtype`` the model runs in.
        kv_cache_dtype: ``--kv-cache-dtype``: ``"auto"`` (the KV cache holds ``dtype``),
            ``"fp8"`` or ``"fp8_e4m3"`` (float8 e4m3, per-layer scales of 1.0); the chosen
            backend must list it in ``supported_kv_cache_dtypes``.
        block_size: Tokens per KV-cache block (``--block-size``); vLLM passes ``None``
            unless the user set it, forkless always knows it.
        use_mla: Multi-head latent attention (always ``False`` in forkless).
        has_sink: Attention sinks (always ``False``).
        use_sparse: Sparse attention (always ``False``).
        use_mm_prefix: A bidirectional multimodal prefix (always ``False``).
        use_per_head_quant_scales: Per-head KV quantization scales (always ``False``).
        attn_type: ``"decoder"``: causal self-attention.
        use_non_causal: Non-causal attention (always ``False``).
    """

    head_size: int
    dtype: "torch.dtype"
    kv_cache_dtype: str | None
    block_size: int | None
    use_mla: bool = False
    has_sink: bool = False
    use_sparse: bool = False
    use_mm_prefix: bool = False
    use_per_head_quant_scales: bool = False
    attn_type: str = "decoder"
    use_non_causal: bool = False


class classproperty:  # noqa: N801 - used like ``property``
    """A read-only attribute computed from the class, read on the class or an instance.

    Platform hooks are classmethods, so a value they read that must be computed (the CUDA
    platform's default backend depends on whether Triton is installed) cannot be a
    ``property``, which only works on instances.
    """

    def __init__(self, fget: Callable[[Any], Any]) -> None:
        self.fget = fget
        self.__doc__ = fget.__doc__

    def __get__(self, instance: Any, owner: type) -> Any:
        return self.fget(owner)


@stability(Stability.PROVISIONAL)
class Platform:
    """Base class of every platform, built-in or out-of-tree.

    vLLM's attributes:

    Attributes:
        _enum: The kind of device; a platform plugin that does not say otherwise is
            ``PlatformEnum.OOT``.
        device_name: A human-readable device name (logged by the workers, through
            :meth:`get_device_name`).
        device_type: The torch device type (``"cpu"``, ``"cuda"``...).
        dispatch_key: The torch dispatch key of the device.
        ray_device_key: The Ray resource name of the device (``""``: none).
        device_control_env_var: The variable that selects visible devices
            (``CUDA_VISIBLE_DEVICES``); ``""`` when there is none.
        simple_compile_backend: The ``torch.compile`` backend for small functions.
        dist_backend: The ``torch.distributed`` backend.
        supported_quantization: Quantization methods the device runs; empty means any.
        additional_env_vars: Variables that workers must inherit.

    forkless's own:

    Attributes:
        name: How logs name the platform, its class name unless set
            (``FORKLESS_PLATFORM`` selects a built-in by it; an out-of-tree platform is
            selected by its entry-point name).
        default_attention_backend: The attention backend name used when the user passes
            no ``--attention-backend``.
        attention_backends: Backends the platform ships, ``{name: class path}``; they are
            selectable by name on this platform without being registered.
        worker_cls: The worker class path used when the configuration's ``worker_cls``
            is still ``"auto"``.
        device_communicator_cls: The collective-communication helper's class path, or
            ``None`` when the device needs none.
    """

    _enum: ClassVar[PlatformEnum] = PlatformEnum.OOT
    device_name: ClassVar[str] = "unknown"
    device_type: ClassVar[str] = "cpu"
    dispatch_key: ClassVar[str] = "CPU"
    ray_device_key: ClassVar[str] = ""
    device_control_env_var: ClassVar[str] = ""
    simple_compile_backend: ClassVar[str] = "inductor"
    dist_backend: ClassVar[str] = ""
    supported_quantization: ClassVar[list[str]] = []
    additional_env_vars: ClassVar[list[str]] = []

    @classproperty
    def name(cls) -> str:
        # A platform written for vLLM has no ``name``: logs show its class's.
        return cls.__name__

    default_attention_backend: ClassVar[str] = "torch"
    attention_backends: ClassVar[dict[str, str]] = {}
    worker_cls: ClassVar[str] = "forkless.worker.worker:Worker"
    device_communicator_cls: ClassVar[str | None] = None

    # ------------------------------------------------------------------ which device

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_rocm(self) -> bool:
        return self._enum == PlatformEnum.ROCM

    def is_tpu(self) -> bool:
        return self._enum == PlatformEnum.TPU

    def is_xpu(self) -> bool:
        return self._enum == PlatformEnum.XPU

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_out_of_tree(self) -> bool:
        return self._enum == PlatformEnum.OOT

    def is_unspecified(self) -> bool:
        return self._enum == PlatformEnum.UNSPECIFIED

    def is_cuda_alike(self) -> bool:
        """CUDA or ROCm."""
        return self._enum in (PlatformEnum.CUDA, PlatformEnum.ROCM)

    @classmethod
    def is_available(cls) -> bool:
        """Whether this platform's device is present (asked of the built-ins only: an
        out-of-tree platform's detector answers for it)."""
        return True

    # ------------------------------------------------------------------ configuration

    @classmethod
    def pre_register_and_update(cls, parser: Any = None) -> None:
        """Register what the platform brings before any configuration exists.

        forkless calls it once per process, right after choosing the platform, with
        ``parser=None``.
        """

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        """Check the engine configuration against this device and adjust it, in place.

        forkless calls it once, where the configuration is created (the API server or the
        offline ``LLM``'s process); the workers receive the result. The default fills
        what is still open with this platform's choices: ``parallel_config.worker_cls``
        when it is ``"auto"`` and the device communicator. A platform may set
        ``worker_cls`` itself (as vLLM platforms do) and need not call ``super()``:
        a ``"auto"`` left over means :attr:`worker_cls`.

        Args:
            vllm_config: The ``forkless.config.EngineConfig``.

        Raises:
            ValueError: The configuration cannot run on this device (a subclass's choice).
        """
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = cls.worker_cls
        if parallel.device_communicator_cls is None:
            parallel.device_communicator_cls = cls.get_device_communicator_cls()

    @classmethod
    def verify_model_arch(cls, model_arch: str) -> None:
        """Raise when the device cannot run ``model_arch`` (called with the config's
        architecture before :meth:`check_and_update_config`); every one runs by default."""

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        """Raise when the device cannot run the ``quant`` quantization method.

        Raises:
            ValueError: ``quant`` is not in a non-empty :attr:`supported_quantization`.
        """
        if cls.supported_quantization and quant not in cls.supported_quantization:
            raise ValueError(f"{quant} quantization is currently not supported in {cls.device_name}.")

    @classmethod
    def check_max_model_len(cls, max_model_len: int) -> int:
        """The context length the device can serve for a requested one (unchanged)."""
        return max_model_len

    # ------------------------------------------------------------------ attention

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: str | None,
        attn_selector_config: AttentionSelectorConfig | None = None,
        num_heads: int | None = None,
    ) -> str:
        """The attention backend class path for this device (vLLM's hook).

        Each worker calls it once, before loading the model, as vLLM calls it:
        ``get_attn_backend_cls(selected_backend, attn_selector_config=...,
        num_heads=...)``. The path (``"pkg.mod:Class"`` or ``"pkg.mod.Class"``) must name a
        ``forkless.attention.AttentionBackend`` subclass.

        Args:
            selected_backend: The ``--attention-backend`` name, or ``None``.
            attn_selector_config: What the backend must handle; ``None`` only when
                called outside a worker.
            num_heads: The model's number of query heads.

        Returns:
            The default: :meth:`attention_backend_path` of ``selected_backend``.

        Raises:
            KeyError: The name is neither the platform's nor registered; the message
                lists both.
        """
        return cls.attention_backend_path(selected_backend)

    @classmethod
    def resolved_attention_backend(cls, selected_backend: str | None) -> str:
        """The backend name ``selected_backend`` (or this platform's default) stands for."""
        return selected_backend or cls.default_attention_backend

    @classmethod
    def attention_backend_path(cls, selected_backend: str | None) -> str:
        """The class path a backend name stands for on this platform.

        The platform's own :attr:`attention_backends` first, then the registered ones.
        forkless calls it where the configuration is created, to reject an unknown
        ``--attention-backend`` before anything starts; it never calls a subclass's
        :meth:`get_attn_backend_cls` there, which may need torch.

        Raises:
            KeyError: The name is neither the platform's nor registered.
        """
        from forkless.attention.registry import attention_backend_path

        name = cls.resolved_attention_backend(selected_backend)
        if name in cls.attention_backends:
            return cls.attention_backends[name]
        try:
            return attention_backend_path(name)
        except KeyError as exc:
            if not cls.attention_backends:
                raise
            own = ", ".join(sorted(cls.attention_backends))
            raise KeyError(f"{exc.args[0]} (the {cls.name} platform's own: {own})") from None

    # ------------------------------------------------------------------ the device

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        """The device's name (vLLM raises ``NotImplementedError``; here :attr:`device_name`)."""
        return cls.device_name

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
        """The device's compute capability; ``None`` when it has none."""
        return None

    @classmethod
    def has_device_capability(cls, capability: tuple[int, int] | int, device_id: int = 0) -> bool:
        """Whether the device's capability is at least ``capability`` (a tuple or ``89``)."""
        current = cls.get_device_capability(device_id=device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current >= capability
        return current.to_int() >= capability

    @classmethod
    def device_id_to_physical_device_id(cls, device_id: int) -> int:
        """The physical index of logical device ``device_id``, through
        :attr:`device_control_env_var` when it is set and not empty."""
        visible = os.environ.get(cls.device_control_env_var, "") if cls.device_control_env_var else ""
        return int(visible.split(",")[device_id]) if visible else device_id

    @classmethod
    def get_cpu_architecture(cls) -> CpuArchEnum:
        """The host CPU's architecture family."""
        machine = _host.machine().lower()
        if machine in ("x86_64", "amd64", "i386", "i686"):
            return CpuArchEnum.X86
        if machine.startswith(("arm", "aarch")):
            return CpuArchEnum.ARM
        if machine.startswith("ppc"):
            return CpuArchEnum.POWERPC
        if machine == "s390x":
            return CpuArchEnum.S390X
        if machine.startswith("riscv"):
            return CpuArchEnum.RISCV
        return CpuArchEnum.OTHER if machine else CpuArchEnum.UNKNOWN

    @classmethod
    def torch_device(cls, index: int = 0) -> "torch.device":
        """The ``torch.device`` of local device ``index`` (forkless's)."""
        import torch

        return torch.device(cls.device_type, index) if cls.device_type != "cpu" else torch.device("cpu")

    @classmethod
    def set_device(cls, device: "torch.device") -> None:
        """Make ``device`` the current one of this process (not called by forkless)."""
        raise NotImplementedError

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        """Total memory of the device in bytes.

        Raises:
            NotImplementedError: The platform does not say (override this or
                :meth:`total_memory_bytes`).
        """
        raise NotImplementedError(f"{cls.__qualname__} implements neither get_device_total_memory() "
                                  "nor total_memory_bytes()")

    @classmethod
    def total_memory_bytes(cls, index: int = 0) -> int:
        """Total memory of the device, for KV-cache sizing (:meth:`get_device_total_memory`)."""
        return cls.get_device_total_memory(index)

    @classmethod
    def free_memory_bytes(cls, index: int = 0) -> int:
        """Memory of the device free now, for KV-cache sizing.

        The default is :meth:`total_memory_bytes`: vLLM asks a platform for its total
        only, and the KV budget taken from it is capped (a share of it on a CPU-type
        device, ``--gpu-memory-utilization`` of it otherwise).
        """
        return cls.total_memory_bytes(index)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        """Whether host memory can be pinned for copies to the device (not called by forkless)."""
        return True

    @classmethod
    def inference_mode(cls) -> Any:
        """The context manager to run the model under (not called by forkless, whose model
        runner uses ``torch.inference_mode``)."""
        import torch

        return torch.inference_mode(mode=True)

    @classmethod
    def seed_everything(cls, seed: int | None = None) -> None:
        """Seed every random generator the platform uses (each worker calls it at start)."""
        if seed is None:
            return
        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    @classmethod
    def import_kernels(cls) -> None:
        """Import the platform's compiled kernels (forkless has no ``_C`` to import)."""

    # ------------------------------------------------------------------ capabilities

    @classmethod
    def get_device_communicator_cls(cls) -> str | None:
        """Class path of the collective-communication helper for tensor parallelism
        (:attr:`device_communicator_cls`; ``None``: none needed)."""
        return cls.device_communicator_cls

    @classmethod
    def supports_fp8(cls) -> bool:
        return False

    @classmethod
    def use_all_gather(cls) -> bool:
        """Whether logits are gathered with all-gather under tensor parallelism."""
        return True

    @classmethod
    def validate_request(cls, prompt: Any, params: Any, processed_inputs: Any) -> None:
        """Raise when a request cannot run on this device (not called by forkless)."""

    # -------------------------------------------------------- vLLM's other hooks
    # vLLM's Platform hooks with vLLM's defaults, so that a ported platform that calls them
    # through super() or cls. keeps working. forkless calls none of them (its own code
    # paths decide these things), so overriding one changes nothing here.

    @classmethod
    def fp8_dtype(cls) -> "torch.dtype":
        """The float8 type of the device (e4m3)."""
        import torch

        return torch.float8_e4m3fn

    @classmethod
    def is_fp8_fnuz(cls) -> bool:
        """Whether the device's float8 is the fnuz variant (ROCm's)."""
        return False

    @classmethod
    def is_kv_cache_dtype_supported(cls, kv_cache_dtype: str, model_config: Any) -> bool:
        """Whether the device stores a KV cache of ``kv_cache_dtype`` (vLLM's default: no)."""
        return False

    @classmethod
    def check_if_supports_dtype(cls, dtype: Any) -> None:
        """Raise when the device cannot run ``dtype`` (default: every dtype runs)."""

    @classproperty
    def supported_dtypes(cls) -> list["torch.dtype"]:
        """The model dtypes the device runs, preferred first."""
        import torch

        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """vLLM's LoRA kernels' class path: forkless has its own LoRA layers."""
        raise NotImplementedError("forkless runs LoRA on its own layers (forkless.lora), not vLLM's punica")

    @classmethod
    def get_current_memory_usage(cls, device: Any = None) -> float:
        """Memory in use on the device, in bytes."""
        raise NotImplementedError(f"{cls.__qualname__} does not report its memory usage")

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        """Seed the device's generators (default: torch's)."""
        import torch

        torch.manual_seed(seed)

    @classmethod
    def use_custom_allreduce(cls) -> bool:
        return False

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        raise NotImplementedError("forkless captures graphs in its model runner (no static graph wrapper)")

    @classmethod
    def get_global_graph_pool(cls) -> Any:
        return None

    @classmethod
    def is_sleep_mode_available(cls) -> bool:
        return False

    @classmethod
    def set_additional_forward_context(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    @classmethod
    def update_block_size_for_backend(cls, vllm_config: Any) -> None:
        """Adjust the KV block size to the attention backend (default: leave it)."""

    @classmethod
    def insert_blocks_to_device(cls, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("forkless has no host KV-cache swap")

    @classmethod
    def swap_out_blocks_to_host(cls, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("forkless has no host KV-cache swap")

    @classmethod
    def use_sync_weight_loader(cls) -> bool:
        return False

    @classmethod
    def make_synced_weight_loader(cls, original_weight_loader: Any) -> Any:
        return original_weight_loader

    @classmethod
    def get_nixl_supported_devices(cls) -> dict[str, tuple[str, ...]]:
        return {}

    @classmethod
    def stateless_init_device_torch_dist_pg(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("forkless sets up torch.distributed itself (forkless.distributed)")

    @classmethod
    def log_warnings(cls) -> None:
        """Log the platform's start-up warnings (default: none)."""

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return False

    @classmethod
    def get_infinity_values(cls, dtype: Any) -> tuple[float, float]:
        """``(-inf, inf)`` as the device writes them for ``dtype``."""
        return float("-inf"), float("inf")

    @classmethod
    def is_device_capability(cls, capability: tuple[int, int] | int, device_id: int = 0) -> bool:
        """Whether the device's capability is exactly ``capability``."""
        current = cls.get_device_capability(device_id=device_id)
        if current is None:
            return False
        return current == capability if isinstance(capability, tuple) else current.to_int() == capability

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} device_type={self.device_type!r}>"
