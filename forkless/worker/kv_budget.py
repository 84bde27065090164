"""How many KV-cache blocks a worker can afford, and what one element of it costs.

A block's bytes come from the model runner (``ModelRunner.bytes_per_block``), which
multiplies the cache's element count by the element size of ``--kv-cache-dtype``: the
model dtype for ``auto``, one byte for ``fp8`` / ``fp8_e4m3``, so the same budget holds
twice the blocks of a 16-bit model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from forkless.config import EngineConfig

from forkless.config import CPU_KV_CACHE_FRACTION, CPU_KV_CACHE_MAX_BYTES, KV_CACHE_DTYPE_CHOICES


def kv_cache_torch_dtype(cache_dtype: str, model_dtype: "torch.dtype", backend: type, device: "torch.device",
                         ) -> "torch.dtype":
    """The torch dtype the KV cache holds for ``--kv-cache-dtype cache_dtype``.

    Args:
        cache_dtype: The flag's value.
        model_dtype: The dtype the model runs in (``auto`` stores it).
        backend: The attention backend class; it lists what it reads in
            ``supported_kv_cache_dtypes``.
        device: Where the cache lives.

    Returns:
        ``model_dtype`` or ``torch.float8_e4m3fn``.

    Raises:
        ValueError: An unknown value, one the backend does not read, or fp8 on a GPU
            older than compute capability 8.9; the message names the flag and what works.
    """
    import torch

    if cache_dtype not in KV_CACHE_DTYPE_CHOICES:
        raise ValueError(f"--kv-cache-dtype={cache_dtype!r} is invalid: expected one of "
                         f"{', '.join(KV_CACHE_DTYPE_CHOICES)}")
    supported = tuple(getattr(backend, "supported_kv_cache_dtypes", ("auto",)))
    name = getattr(backend, "name", "") or backend.__name__
    if cache_dtype not in supported:
        raise ValueError(
            f"--kv-cache-dtype {cache_dtype} is not supported by the {name!r} attention backend on "
            f"{device.type} (it supports: {', '.join(supported)}); fp8 needs the 'triton' backend on a CUDA "
            "GPU, or --attention-backend torch (the reference, slow)")
    if cache_dtype == "auto":
        return model_dtype
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"--kv-cache-dtype {cache_dtype} needs a GPU of compute capability 8.9 or newer "
                         f"(float8 e4m3 conversions); this one is {major}.{minor}: use --kv-cache-dtype auto")
    return torch.float8_e4m3fn


def kv_budget_bytes(
    config: EngineConfig,
    *,
    device_type: str,
    free_bytes: int,
    total_bytes: int,
    used_bytes: int,
    bytes_per_block: int,
) -> int:
    """The bytes to spend on the KV cache.

    ``--kv-cache-memory`` wins when given. Otherwise, on CPU, a modest share of the
    available host memory (``min(25% of it, 4 GiB)``); on an accelerator,
    ``--gpu-memory-utilization`` of the device minus what is already in use (weights and
    the profiled activation peak). The default never exceeds what ``max_num_seqs``
    sequences of ``max_model_len`` tokens could use.

    Args:
        config: The engine configuration.
        device_type: The torch device type.
        free_bytes: Memory available now.
        total_bytes: Memory of the device.
        used_bytes: Memory forkless (and others) hold on the device after profiling.
        bytes_per_block: KV bytes of one block over all layers.

    Returns:
        A budget in bytes (may be below one block; the caller reports that).
    """
    explicit = config.cache_config.kv_cache_memory
    if explicit is not None:
        return explicit
    if device_type == "cpu":
        budget = min(int(free_bytes * CPU_KV_CACHE_FRACTION), CPU_KV_CACHE_MAX_BYTES)
    else:
        budget = int(total_bytes * config.cache_config.gpu_memory_utilization) - used_bytes
    sched = config.scheduler_config
    block_size = config.cache_config.block_size
    blocks_per_seq = -(-sched.max_model_len // block_size)
    needed = sched.max_num_seqs * blocks_per_seq * bytes_per_block
    return max(0, min(budget, needed))


def num_blocks_for(budget_bytes: int, bytes_per_block: int, config: EngineConfig, reserved_bytes: int = 0) -> int:
    """Blocks that fit ``budget_bytes`` once ``reserved_bytes`` (a draft model's scratch
    blocks) are taken out of it.

    Raises:
        ValueError: Not even one ``max_model_len`` sequence fits; the message says
            which flag to change.
    """
    left = max(0, budget_bytes - reserved_bytes)
    num_blocks = left // bytes_per_block
    block_size = config.cache_config.block_size
    max_model_len = config.scheduler_config.max_model_len
    if num_blocks * block_size < max_model_len:
        need = -(-max_model_len // block_size) * bytes_per_block
        reserved = (f", of which the draft model's scratch blocks (max_num_seqs="
                    f"{config.scheduler_config.max_num_seqs}) take {reserved_bytes} bytes first" if reserved_bytes else "")
        raise ValueError(
            f"the KV cache budget ({budget_bytes} bytes{reserved}: {num_blocks} blocks of {block_size} "
            f"tokens left) cannot hold one sequence of max_model_len={max_model_len} tokens, which "
            f"needs {need + reserved_bytes} bytes; raise --kv-cache-memory / --gpu-memory-utilization or lower "
            "--max-model-len" + (" or --max-num-seqs" if reserved_bytes else "")
        )
    return num_blocks
