"""Streaming the tensors of a Hugging Face model folder, one at a time.

Tensors are yielded one by one (memory-mapped by safetensors) so that loading never holds
a second full copy of the model in host memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterator

import torch

from forkless.models.weight_loading import TensorShard

#: A model's answer to "which part of checkpoint tensor ``name`` of ``shape`` does this
#: rank need?": a :class:`TensorShard`, or None for the whole tensor.
ShardFn = Callable[[str, tuple[int, ...]], "TensorShard | None"]

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


def _files_from_index(index_path: Path) -> list[Path]:
    with open(index_path, encoding="utf-8") as f:
        weight_map: dict[str, str] = json.load(f)["weight_map"]
    return [index_path.parent / name for name in sorted(set(weight_map.values()))]


def weight_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint files of a folder, safetensors preferred.

    The index file, when present, decides which shards belong to the model: folders
    sometimes also hold a ``consolidated.safetensors`` copy that must not be loaded twice.

    Args:
        model_dir: A Hugging Face model folder.

    Returns:
        The files to read, in a stable order.

    Raises:
        FileNotFoundError: The folder has no ``*.safetensors`` or ``pytorch_model*.bin``.
    """
    folder = Path(model_dir)
    if (folder / SAFETENSORS_INDEX).is_file():
        return _files_from_index(folder / SAFETENSORS_INDEX)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if (folder / BIN_INDEX).is_file():
        return _files_from_index(folder / BIN_INDEX)
    files = sorted(folder.glob("pytorch_model*.bin"))
    if files:
        return files
    raise FileNotFoundError(
        f"no model weights in {str(folder)!r}: expected *.safetensors (or pytorch_model*.bin)"
    )


def _read_file(path: Path, shard: ShardFn | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if shard is None:
                    yield name, f.get_tensor(name)
                    continue
                lazy = f.get_slice(name)
                part = shard(name, tuple(lazy.get_shape()))
                if part is None:
                    yield name, f.get_tensor(name)
                else:
                    # Only this rank's rows / columns are read from the file.
                    index = (slice(None),) * part.dim + (slice(part.start, part.start + part.size),)
                    yield name, lazy[index]
    else:
        # weights_only: a .bin is a pickle, and unpickling arbitrary objects runs code.
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        for name, tensor in state.items():
            part = shard(name, tuple(tensor.shape)) if shard is not None else None
            # mmap'd: the copy of the slice reads only its pages.
            yield name, tensor if part is None else tensor.narrow(part.dim, part.start, part.size).clone()


def iterate_weights(
    model_dir: str | os.PathLike[str], dtype: torch.dtype | None = None, shard: ShardFn | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every ``(name, tensor)`` of a model folder's checkpoint.

    Args:
        model_dir: A Hugging Face model folder.
        dtype: When given, floating-point tensors are converted to it (integer tensors,
            e.g. quantization metadata, are left alone).
        shard: With tensor parallelism, the model's ``weight_shard``: each tensor it
            answers for is read only in part, so no rank ever holds the whole model.

    Yields:
        ``(hugging_face_name, cpu_tensor)`` pairs.

    Raises:
        FileNotFoundError: The folder holds no weight files.
    """
    for path in weight_files(model_dir):
        for name, tensor in _read_file(path, shard):
            if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                tensor = tensor.to(dtype)
            yield name, tensor
