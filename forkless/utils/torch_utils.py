"""vLLM's ``vllm.utils.torch_utils.async_tensor_h2d``: a small host list on the device
without the host waiting for the copy (the worker's per-step indices and seeds)."""

from __future__ import annotations

import torch

__all__ = ["async_tensor_h2d"]


def async_tensor_h2d(data: list, dtype: torch.dtype, target_device: str | torch.device,
                     pin_memory: bool) -> torch.Tensor:
    """``data`` as a tensor on ``target_device``, copied with ``non_blocking``.

    Args:
        data: The values (a list, or nested lists of one shape).
        dtype: The tensor's type.
        target_device: Where it goes.
        pin_memory: Stage the values in pinned host memory (pass ``True`` for a CUDA
            device): a copy from pageable memory may wait for the device's stream, which
            in an overlapped step is still busy with the step before.

    Returns:
        The device tensor; its values arrive in stream order before later work on it.
    """
    host = torch.tensor(data, dtype=dtype, device="cpu", pin_memory=pin_memory)
    return host.to(target_device, non_blocking=True)
