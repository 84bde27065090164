"""Reading and checking a PEFT LoRA adapter folder without torch.

Invariants:
    * Torch-free: the API server checks an adapter here before any request for it reaches
      the engine, and the worker runs the same checks before loading the tensors, so a
      malformed adapter is a ``ValueError`` naming the adapter and the problem, never a
      crash of a step.
    * Only the safetensors *header* is read here (its JSON: names, dtypes, shapes); the
      worker reads the tensors themselves (:mod:`forkless.lora.layers`).
    * Module names are the checkpoint's (Hugging Face) ones, ``model.layers.3.self_attn.q_proj``:
      a model maps them onto its own fused layers (``CausalLMBase.lora_modules``).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from forkless.protocol.lora import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

#: The projections an adapter may target (the last component of a module name).
SUPPORTED_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The built-in architectures whose projections :func:`llama_lora_shapes` describes.
LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
_DTYPES = ("F32", "F16", "BF16")
# base_model.model.<module>.lora_A.weight (PEFT's save_pretrained); ".default" when saved
# from the state dict of a model that still names its adapter.
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.default)?\.weight$")
# Every key of a decoder projection has this shape; the layer index is checked too.
_MODULE = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\.(?P<proj>\w+)$")


class LoRAAdapterError(ValueError):
    """A LoRA adapter cannot be served; the message names the adapter and the problem."""


@dataclass
class AdapterSpec:
    """What an adapter folder holds, checked against the model.

    Attributes:
        name: The adapter's name (for messages).
        path: Its folder.
        rank: ``r``.
        scaling: What ``B @ A`` is multiplied by: ``lora_alpha / r``, or
            ``lora_alpha / sqrt(r)`` with ``use_rslora``.
        base_model_name: ``base_model_name_or_path`` from its config, if any.
        modules: Checkpoint module name -> ``(lora_A key, lora_B key)`` in the weights file.
        shapes: Checkpoint module name -> ``(in_features, out_features)`` (from the tensors).
    """

    name: str
    path: Path
    rank: int
    scaling: float
    base_model_name: str | None
    modules: dict[str, tuple[str, str]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def weights_file(self) -> Path:
        """The adapter's ``adapter_model.safetensors``."""
        return self.path / WEIGHTS_FILE


def llama_lora_shapes(hf_config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of every adaptable projection of a Llama-family model.

    The built-in architectures (Llama, Mistral, Qwen2, Qwen3) share these; the worker
    checks an adapter against the model's own layers as well, so a plugin architecture is
    covered there.

    Args:
        hf_config: The model's ``config.json`` as a dict (its ``text_config`` if nested).

    Returns:
        Checkpoint module name -> ``(in_features, out_features)``.
    """
    hidden = int(hf_config["hidden_size"])
    heads = int(hf_config["num_attention_heads"])
    head_dim = int(hf_config.get("head_dim") or hidden // heads)
    kv = int(hf_config.get("num_key_value_heads") or heads) * head_dim
    inter = int(hf_config["intermediate_size"])
    per_layer = {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (heads * head_dim, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    return {f"model.layers.{i}.{name}": shape
            for i in range(int(hf_config["num_hidden_layers"])) for name, shape in per_layer.items()}


# Bytes per element of the safetensors dtypes, to check each tensor's byte range.
_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
             "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, offsets),
    checked as the safetensors loader checks it: every entry has a dtype, a shape of
    non-negative integers and a byte range of that size, and the ranges cover the data
    exactly (a truncated file is refused here, not when a request first reads it).

    Raises:
        ValueError: The file is not a complete safetensors file.
    """
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("the file is shorter than a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > 100 << 20:
            raise ValueError(f"its header claims {size} bytes: not a safetensors file")
        raw = f.read(size)
        data_size = os.fstat(f.fileno()).st_size - 8 - size
    if len(raw) != size:
        raise ValueError(f"the file ends inside its {size}-byte header (truncated?)")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    header.pop("__metadata__", None)
    ranges = []
    for key, info in header.items():
        if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
            raise ValueError(f"tensor {key!r}: its header entry has no dtype")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"tensor {key!r}: its shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"tensor {key!r}: its data_offsets {offsets!r} are not a byte range [begin, end]")
        itemsize = _ITEMSIZE.get(info["dtype"])
        if itemsize is not None and offsets[1] - offsets[0] != math.prod(shape) * itemsize:
            raise ValueError(f"tensor {key!r}: {info['dtype']} {shape} needs {math.prod(shape) * itemsize} "
                             f"bytes, its data_offsets {offsets} hold {offsets[1] - offsets[0]}")
        ranges.append(offsets)
    end = 0
    for begin, stop in sorted(ranges):
        if begin != end:
            raise ValueError(f"the tensors' byte ranges leave a gap or overlap at byte {min(begin, end)}")
        end = stop
    if end != data_size:
        raise ValueError(f"the tensors need {end} bytes of data, the file has {max(data_size, 0)} "
                         f"({'truncated' if end > data_size else 'trailing bytes'})")
    return header


def _fail(lora: LoRARequest, problem: str) -> LoRAAdapterError:
    return LoRAAdapterError(f"LoRA adapter {lora.lora_name!r} ({lora.lora_path}): {problem}")


def _is(lora: LoRARequest, path: Path, kind: str) -> bool:
    """Whether ``path`` is a folder (``kind`` "dir") or a file; a path the OS refuses to
    look at (too long, not readable) is the adapter's error, not the server's."""
    try:
        return stat.S_ISDIR(path.stat().st_mode) if kind == "dir" else stat.S_ISREG(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the path
        return False
    except OSError as exc:
        raise _fail(lora, f"{path.name or path} cannot be read: {exc.strerror or type(exc).__name__}") from None


def _read_config(lora: LoRARequest, folder: Path) -> dict[str, Any]:
    if not _is(lora, folder, "dir"):
        raise _fail(lora, "a file, not a PEFT adapter folder" if _is(lora, folder, "file") else "no such folder")
    cfg_path = folder / CONFIG_FILE
    if not _is(lora, cfg_path, "file"):
        raise _fail(lora, f"no {CONFIG_FILE} in the folder (expected a PEFT adapter saved with save_pretrained)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(lora, f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise _fail(lora, f"{CONFIG_FILE} is not a JSON object")
    return cfg


def _check_config(lora: LoRARequest, cfg: dict[str, Any], max_rank: int) -> tuple[int, float]:
    """Rank and scaling, after refusing every PEFT option forkless does not implement."""
    peft_type = cfg.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise _fail(lora, f"peft_type is {peft_type!r}; only LORA adapters are supported")
    rank = cfg.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _fail(lora, f"'r' in {CONFIG_FILE} must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise _fail(lora, f"rank r={rank} is above --max-lora-rank {max_rank}; start the engine with "
                          f"--max-lora-rank {rank} or more")
    alpha = cfg.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise _fail(lora, f"'lora_alpha' must be a finite number, got {alpha!r}")
    unsupported = {
        "use_dora": bool(cfg.get("use_dora")),
        "bias": cfg.get("bias", "none") not in (None, "none"),
        "modules_to_save": bool(cfg.get("modules_to_save")),
        "fan_in_fan_out": bool(cfg.get("fan_in_fan_out")),
        "rank_pattern": bool(cfg.get("rank_pattern")),
        "alpha_pattern": bool(cfg.get("alpha_pattern")),
    }
    for option, used in unsupported.items():
        if used:
            raise _fail(lora, f"{option}={cfg.get(option)!r} is not supported (forkless serves plain LoRA "
                              "on the q/k/v/o/gate/up/down projections)")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):  # a string is a regular expression (or "all-linear")
        for name in targets:
            if name not in SUPPORTED_TARGET_MODULES:
                raise _fail(lora, f"target module {name!r} is not supported; expected some of "
                                  f"{', '.join(SUPPORTED_TARGET_MODULES)}")
    scale_by = math.sqrt(rank) if cfg.get("use_rslora") else rank
    return rank, float(alpha) / scale_by


def read_adapter(
    lora: LoRARequest,
    *,
    max_rank: int,
    module_shapes: Mapping[str, tuple[int, int]] | None = None,
) -> AdapterSpec:
    """Read and check a PEFT adapter folder.

    Args:
        lora: The adapter (its ``lora_path`` is the folder).
        max_rank: ``--max-lora-rank``.
        module_shapes: The model's adaptable projections, checkpoint module name ->
            ``(in_features, out_features)``; ``None`` checks only the adapter's own
            consistency.

    Returns:
        The adapter's description (no tensor data).

    Raises:
        LoRAAdapterError: The folder, its config or its weights are missing or malformed,
            the rank is above ``max_rank``, a module is not an adaptable projection of the
            model, or a tensor's shape does not fit it. The message names the adapter.
    """
    try:
        folder = Path(lora.lora_path).expanduser()
    except RuntimeError:  # "~name/..." of no such user
        raise _fail(lora, "no such folder (its ~user has no home folder)") from None
    cfg = _read_config(lora, folder)
    rank, scaling = _check_config(lora, cfg, max_rank)
    weights = folder / WEIGHTS_FILE
    if not _is(lora, weights, "file"):
        if _is(lora, folder / "adapter_model.bin", "file"):
            raise _fail(lora, f"only {WEIGHTS_FILE} is supported, the folder has adapter_model.bin "
                              "(save the adapter with safe_serialization=True)")
        raise _fail(lora, f"no {WEIGHTS_FILE} in the folder")
    try:
        header = read_safetensors_header(weights)
    except (OSError, ValueError) as exc:
        raise _fail(lora, f"{WEIGHTS_FILE}: {exc}") from None
    pairs: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for key, info in header.items():
        m = _KEY.match(key)
        if m is None:
            raise _fail(lora, f"tensor {key!r} is not a LoRA weight of a projection (lora_A / lora_B); "
                              "embedding, LM-head, bias and modules_to_save weights are not supported")
        module = m["module"]
        mm = _MODULE.match(module)
        if mm is None or mm["proj"] not in SUPPORTED_TARGET_MODULES:
            raise _fail(lora, f"tensor {key!r}: module {module!r} is not supported; expected the "
                              f"{', '.join(SUPPORTED_TARGET_MODULES)} projections of model.layers.N")
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            got = info.get("dtype") if isinstance(info, dict) else info
            raise _fail(lora, f"tensor {key!r} has dtype {got!r}; expected one of {', '.join(_DTYPES)}")
        pairs.setdefault(module, {})[m["which"]] = (key, list(info.get("shape", [])))
    if not pairs:
        raise _fail(lora, f"{WEIGHTS_FILE} holds no LoRA weights")
    spec = AdapterSpec(lora.lora_name, folder, rank, scaling, cfg.get("base_model_name_or_path"))
    for module in sorted(pairs):
        both = pairs[module]
        if set(both) != {"A", "B"}:
            missing = "lora_B" if "A" in both else "lora_A"
            raise _fail(lora, f"module {module!r} has no {missing} weight")
        (a_key, a_shape), (b_key, b_shape) = both["A"], both["B"]
        if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[0] != rank or b_shape[1] != rank:
            raise _fail(lora, f"module {module!r}: lora_A is {a_shape} and lora_B is {b_shape}; expected "
                              f"[{rank}, in_features] and [out_features, {rank}] for r={rank}")
        shape = (a_shape[1], b_shape[0])
        if module_shapes is not None:
            expected = module_shapes.get(module)
            if expected is None:
                raise _fail(lora, f"module {module!r} does not exist in the model (wrong base model? "
                                  f"it has {_layer_count(module_shapes)} layers)")
            if tuple(expected) != shape:
                raise _fail(lora, f"module {module!r} is {shape[0]} -> {shape[1]} in the adapter but "
                                  f"{expected[0]} -> {expected[1]} in the model (wrong base model?)")
        spec.modules[module] = (a_key, b_key)
        spec.shapes[module] = shape
    return spec


def _layer_count(module_shapes: Mapping[str, tuple[int, int]]) -> int:
    layers = {m["layer"] for name in module_shapes if (m := _MODULE.match(name))}
    return len(layers)
