"""The ``Platform`` interface (provisional tier): what a device must tell forkless.

A new device is a platform plugin: a ``Platform`` subclass that supplies the worker
class, the attention backend and the device communicator, while the scheduler and the
KV cache manager are reused unchanged. Methods that need torch import it themselves, so
that resolving the platform stays cheap in the API server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    import torch


@stability(Stability.PROVISIONAL)
class Platform:
    """Base class of every platform, built-in or out-of-tree.

    Attributes:
        name: The name ``FORKLESS_PLATFORM`` selects it by.
        device_type: The torch device type (``"cpu"``, ``"cuda"``...).
        default_attention_backend: Registered attention backend name used when the user
            passes no ``--attention-backend``.
    """

    name: str = "base"
    device_type: str = "cpu"
    device_name: str = "unknown"
    default_attention_backend: str = "torch"
    worker_cls: str = "forkless.worker.worker:Worker"
    device_communicator_cls: str | None = None

    @classmethod
    def is_available(cls) -> bool:
        """Whether this platform's device is present on this machine."""
        return True

    def check_and_update_config(self, config: Any) -> None:
        """Adjust the engine configuration for this device, in place.

        The default fills what the user left open with this platform's choices: the
        worker class and the device communicator. Subclasses call ``super()`` and then
        change what their device needs (for example turn CUDA graphs off).

        Args:
            config: The ``forkless.config.EngineConfig``; changed in place.
        """
        parallel = config.parallel_config
        if parallel.worker_cls is None:
            parallel.worker_cls = self.worker_cls
        if parallel.device_communicator_cls is None:
            parallel.device_communicator_cls = self.get_device_communicator_cls()

    def resolved_attention_backend(self, selected_backend: str | None) -> str:
        """The backend name ``selected_backend`` (or this platform's default) stands for."""
        return selected_backend or self.default_attention_backend

    def get_attn_backend_cls(self, selected_backend: str | None, **kwargs: Any) -> str:
        """The attention backend class path for ``selected_backend`` (or the default).

        Raises:
            KeyError: The name is not registered; the message lists the registered ones.
        """
        from forkless.attention.registry import attention_backend_path

        return attention_backend_path(self.resolved_attention_backend(selected_backend))

    def get_device_communicator_cls(self) -> str | None:
        """Class path of the collective-communication helper for tensor parallelism."""
        return self.device_communicator_cls

    def torch_device(self, index: int = 0) -> "torch.device":
        import torch

        return torch.device(self.device_type, index) if self.device_type != "cpu" else torch.device("cpu")

    def total_memory_bytes(self, index: int = 0) -> int:
        """Total memory of the device, for KV-cache sizing."""
        raise NotImplementedError

    def free_memory_bytes(self, index: int = 0) -> int:
        """Currently free memory of the device, for KV-cache sizing."""
        raise NotImplementedError

    def seed_everything(self, seed: int | None) -> None:
        """Seed every random generator the platform uses."""
        if seed is None:
            return
        import random

        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} device_type={self.device_type!r}>"
