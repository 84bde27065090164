"""Choosing the model dtype from ``--dtype`` and the model's config."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
DTYPE_CHOICES = ("auto", *_DTYPES)


def _config_dtype(hf_config: "PretrainedConfig") -> torch.dtype | None:
    # transformers 5 calls it ``dtype``; older versions ``torch_dtype``.
    for attr in ("dtype", "torch_dtype"):
        value = getattr(hf_config, attr, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str):
            return _DTYPES.get(value.removeprefix("torch."))
    return None


def resolve_dtype(
    dtype: str | torch.dtype, hf_config: "PretrainedConfig", device: str | torch.device
) -> torch.dtype:
    """The dtype to build the model in.

    Args:
        dtype: ``"auto"``, ``"float32"``/``"float"``, ``"bfloat16"``,
            ``"float16"``/``"half"``, or a ``torch.dtype``.
        hf_config: The model's config; ``"auto"`` uses its ``dtype``/``torch_dtype``.
        device: Target device; ``"auto"`` means float32 on CPU, where half-precision
            matmuls are slow or unsupported.

    Returns:
        A floating ``torch.dtype``.

    Raises:
        ValueError: ``dtype`` is not one of the choices (the message lists them).
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; choose one of: {', '.join(DTYPE_CHOICES)}")
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name == "auto":
        if torch.device(device).type == "cpu":
            return torch.float32
        config_dtype = _config_dtype(hf_config)
        return config_dtype if config_dtype in _DTYPES.values() else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPE_CHOICES)}")
    return _DTYPES[name]
