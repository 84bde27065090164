"""How many KV-cache blocks a worker can afford."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forkless.config import EngineConfig

from forkless.config import CPU_KV_CACHE_FRACTION, CPU_KV_CACHE_MAX_BYTES


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


def num_blocks_for(budget_bytes: int, bytes_per_block: int, config: EngineConfig) -> int:
    """Blocks that fit ``budget_bytes``.

    Raises:
        ValueError: Not even one ``max_model_len`` sequence fits; the message says
            which flag to change.
    """
    num_blocks = budget_bytes // bytes_per_block
    block_size = config.cache_config.block_size
    max_model_len = config.scheduler_config.max_model_len
    if num_blocks * block_size < max_model_len:
        need = -(-max_model_len // block_size) * bytes_per_block
        raise ValueError(
            f"the KV cache budget ({budget_bytes} bytes = {num_blocks} blocks of {block_size} "
            f"tokens) cannot hold one sequence of max_model_len={max_model_len} tokens, which "
            f"needs {need} bytes; raise --kv-cache-memory / --gpu-memory-utilization or lower "
            "--max-model-len"
        )
    return num_blocks
