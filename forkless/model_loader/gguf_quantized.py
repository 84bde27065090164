"""The quantized matrices of a GGUF file, kept quantized (``--quantization gguf``).

:mod:`forkless.model_loader.gguf_loader` turns a GGUF file into a float32 Hugging Face
folder, which is what every model loads. With ``--quantization gguf`` the CPU worker then
reads the file's Q8_0 and Q4_1 matrices again, as they are stored, and runs the linear
layers on them (:mod:`forkless.models.layers.gguf_linear`): a quarter or less of the bytes a
decode step reads.

Invariants: the rows returned are the file's blocks unchanged, except that the rows of a
Llama query/key projection are put back in Hugging Face order exactly as the converter
puts the dequantized rows (a permutation of whole rows, which GGUF quantizes one by one);
names are the converter's Hugging Face names.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from forkless.model_loader.gguf_loader import (
    _PERMUTED_ARCHITECTURES,
    MARKER_FILE,
    _hf_tensor_name,
    _unpermute_rotary,
    is_gguf,
)

if TYPE_CHECKING:
    import numpy as np

    from forkless.models.interface import CausalLMBase


@dataclass(frozen=True)
class QuantizedMatrix:
    """One ``[out_features, in_features]`` matrix as the GGUF file stores it.

    Attributes:
        format: One of :data:`forkless.models.layers.gguf_linear.FORMATS` (``"Q8_0"``,
            ``"Q4_1"``).
        rows: ``[out_features, in_features / 32 * FORMATS[format]]`` uint8: each row's
            blocks, in the file's byte layout.
        in_features: Weights per row.
    """

    format: str
    rows: "np.ndarray"
    in_features: int


def source_gguf(model: str | os.PathLike[str]) -> Path | None:
    """The GGUF file ``model`` came from: ``model`` itself, or the file a converted folder's
    marker names; None for any other folder."""
    path = Path(model)
    if is_gguf(path):
        return path
    marker = path / MARKER_FILE
    if not marker.is_file():
        return None
    source = Path(json.loads(marker.read_text())["source"]["path"])
    return source if is_gguf(source) else None


def read_quantized_matrices(gguf_path: str | os.PathLike[str]) -> dict[str, QuantizedMatrix]:
    """Every 2-D Q8_0 / Q4_1 tensor of the file, by its Hugging Face name.

    Raises:
        forkless.model_loader.gguf_loader.GGUFConversionError: A tensor has no Hugging
            Face name (an architecture the converter does not support).
    """
    import numpy as np
    from gguf import GGUFReader

    from forkless.models.layers.gguf_linear import FORMATS  # the formats the layer runs

    reader = GGUFReader(gguf_path)
    arch = str(reader.fields["general.architecture"].contents())
    heads = {}
    if arch in _PERMUTED_ARCHITECTURES:
        heads = {"attn_q": int(reader.fields[f"{arch}.attention.head_count"].contents()),
                 "attn_k": int(reader.fields[f"{arch}.attention.head_count_kv"].contents())}
    out: dict[str, QuantizedMatrix] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in FORMATS or len(tensor.shape) != 2:
            continue
        in_features, out_features = (int(d) for d in tensor.shape)
        rows = np.asarray(tensor.data, dtype=np.uint8).reshape(out_features, -1)
        part = tensor.name.split(".")[-2]
        if part in heads:
            rows = _unpermute_rotary(rows, heads[part])
        out[_hf_tensor_name(tensor.name)] = QuantizedMatrix(kind, np.ascontiguousarray(rows), in_features)
    return out


def use_gguf_matrices(model: "CausalLMBase", gguf_path: str | os.PathLike[str]) -> int:
    """Run the model's linear layers on the GGUF file's Q8_0 / Q4_1 blocks.

    Every projection (as ``model.lora_modules()`` names them: a fused module and the
    checkpoint matrices stacked in it) whose matrices the file holds quantized, all in one
    format, becomes a :class:`~forkless.models.layers.gguf_linear.GGUFLinear` with the
    module's bias; so does the LM head (the token embedding's matrix for a tied head). The
    rest keeps its float32 layer. Call after the model's ``use_cpu_kernels``.

    Returns:
        How many layers now run on quantized blocks.

    Raises:
        ValueError: A quantized matrix does not fit the layer it would replace.
    """
    import numpy as np

    from forkless.models.layers.cpu_linear import CPULinear
    from forkless.models.layers.gguf_linear import GGUFLinear

    matrices = read_quantized_matrices(gguf_path)
    targets = {name: [part for part, _ in parts] for name, parts in model.lora_modules().items()}
    targets["lm_head"] = ["model.embed_tokens" if getattr(model, "tie_word_embeddings", False) else "lm_head"]
    count = 0
    for name, parts in targets.items():
        found = [matrices.get(f"{part}.weight") for part in parts]
        if any(m is None for m in found) or len({m.format for m in found}) != 1:
            continue
        layer = model.get_submodule(name)
        if not isinstance(layer, CPULinear):
            continue
        rows = np.concatenate([m.rows for m in found])
        if rows.shape[0] != layer.out_features or found[0].in_features != layer.in_features:
            raise ValueError(f"{name}: the GGUF file's {'+'.join(parts)} is [{rows.shape[0]}, "
                             f"{found[0].in_features}], the layer [{layer.out_features}, {layer.in_features}]")
        bias = None if layer.bias is None else layer.bias[: layer.out_features]
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr,
                GGUFLinear(found[0].format, rows, found[0].in_features, bias))
        count += 1
    return count
