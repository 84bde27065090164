"""Convert a GGUF file into a normal Hugging Face model folder.

The rest of forkless only knows Hugging Face folders (``config.json``, ``*.safetensors``,
``tokenizer.json``), so GGUF support is a one-off conversion rather than a second loader:
tensors are dequantized with :mod:`gguf`, renamed to Hugging Face names, and llama.cpp's
rotary permutation of the query/key projections is undone. The tokenizer is rebuilt by
``transformers``' own GGUF tokenizer conversion.

Supported architectures: ``llama`` (Llama, Mistral, SmolLM2, ...), ``qwen2`` and ``qwen3``.

torch, gguf and transformers are imported inside the functions that need them: the API
server imports this module (through :mod:`forkless.model_loader.default_model`) only to
resolve a cached folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from gguf import GGUFReader

GGUF_MAGIC = b"GGUF"

# Bump whenever the folder this module writes changes: it is part of every cache key, so
# folders written by an older, possibly buggy, converter are not reused.
CONVERTER_VERSION = 1

# Written last into every converted folder; records where the folder came from.
MARKER_FILE = "forkless_gguf.json"

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# llama.cpp's convert_hf_to_gguf.py interleaves the rotary halves of q/k rows for these
# architectures only (ggml's "normal" rope rotates adjacent pairs; HF rotates halves).
# Qwen models use NeoX-style rope in ggml and are stored unpermuted.
_PERMUTED_ARCHITECTURES = {"llama"}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# llama.cpp pre-tokenizer types that split every digit on its own before the GPT-2 regex
# (llama-vocab.cpp). transformers does not know them and would merge digit runs, which
# tokenizes numbers differently from the original Hugging Face tokenizer.
_DIGIT_SPLIT_PRE_TOKENIZERS = {
    "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
}


class GGUFConversionError(ValueError):
    """The GGUF file cannot be turned into a model folder forkless supports."""


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a GGUF file, judged by its magic bytes, not its name.

    Args:
        path: Any path; directories and missing files give False.

    Returns:
        True when ``path`` is a regular file starting with ``b"GGUF"``.
    """
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def source_fingerprint(gguf_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Cheap identity of a GGUF file: resolved path, size and modification time.

    Hashing the content would cost a second per gigabyte on every start; a replaced file
    changes size or mtime in practice.

    Args:
        gguf_path: The GGUF file.

    Returns:
        A JSON-serializable dict, stored in the marker and used for cache keys.
    """
    path = Path(gguf_path).resolve()
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def convert_gguf_to_hf(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Write a Hugging Face model folder equivalent to a GGUF file.

    The folder is built in a temporary sibling directory and renamed into place, so no
    process ever sees a half-written ``out_dir``. When two processes race to convert the
    same file, the first rename wins and the other returns the winner's folder.

    Args:
        gguf_path: The GGUF file.
        out_dir: The folder to create. Its parent is created if needed.
        dtype: Dtype of the written weights: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        overwrite: Replace ``out_dir`` when it already exists.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.

    Raises:
        FileNotFoundError: ``gguf_path`` does not exist.
        GGUFConversionError: Not a GGUF file, or an unsupported architecture, tensor or
            rope scaling.
        FileExistsError: ``out_dir`` exists and ``overwrite`` is False.
        ValueError: Unknown ``dtype``.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype!r}")
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    if not is_gguf(gguf_path):
        raise GGUFConversionError(f"{gguf_path} is not a GGUF file (it does not start with b'GGUF')")
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists; pass overwrite=True to replace it")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        started = time.perf_counter()
        _write_folder(gguf_path, tmp, dtype)
        marker = {
            "converter_version": CONVERTER_VERSION,
            "source": source_fingerprint(gguf_path),
            "dtype": dtype,
            "seconds": round(time.perf_counter() - started, 3),
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        _make_shareable(tmp)
        _publish(tmp, out_dir, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _make_shareable(folder: Path) -> None:
    """Give the folder the permissions of a normally created one.

    mkdtemp (and safetensors) create owner-only entries; a cache shared between users or
    service accounts needs the usual umask-governed modes.
    """
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for entry in folder.iterdir():
        os.chmod(entry, 0o666 & ~umask)


def _publish(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished folder into place (atomic on one filesystem)."""
    if overwrite and out_dir.exists():
        # Move the old folder aside first: a directory rename cannot replace a non-empty one.
        trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if not (out_dir / MARKER_FILE).is_file():
            raise
        # Another process published the same conversion first; its folder is complete.


def _write_folder(gguf_path: Path, out: Path, dtype: str) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    metadata = _read_metadata(reader)
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    config = _build_config(metadata, shapes, dtype)
    _write_tensors(reader, config, out / "model.safetensors", dtype)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", _generation_config(metadata))
    _write_tokenizer(gguf_path, metadata, config, out)


def _read_metadata(reader: GGUFReader) -> dict[str, Any]:
    # The vocabulary arrays are large and read separately by the tokenizer conversion.
    skipped = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
               "tokenizer.ggml.token_type"}
    return {name: field.contents() for name, field in reader.fields.items() if name not in skipped}


def _tidy_float(value: float) -> float:
    # GGUF stores float32: 1e-5 comes back as 9.999999747378752e-06. Round to the
    # float32 precision so config.json shows the value the model was trained with.
    return float(f"{value:.7g}")


def _build_config(metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], dtype: str) -> dict[str, Any]:
    arch = metadata.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise GGUFConversionError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ARCHITECTURES)}"
        )

    def meta(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFConversionError(f"GGUF metadata lacks required key {arch}.{key}")
        return value

    if "rope_freqs.weight" in shapes:
        raise GGUFConversionError(
            "this GGUF stores per-dimension rope frequencies (rope_freqs.weight, Llama 3.1 style "
            "rope scaling), which cannot be converted yet; use the original Hugging Face folder"
        )
    n_heads = int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", shapes["blk.0.attn_q.weight"][0] // n_heads))
    rotary_dim = int(meta("rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise GGUFConversionError(f"partial rotary embeddings ({rotary_dim} of {head_dim}) are not supported")
    rope_theta = _tidy_float(meta("rope.freq_base", 10000.0))

    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta("embedding_length")),
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta("context_length")),
        "rms_norm_eps": _tidy_float(meta("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in shapes,
        "torch_dtype": dtype,
    }
    rope = _rope_parameters(metadata, arch, rope_theta)
    # Both spellings: transformers >= 5 reads rope_parameters, older readers rope_theta /
    # rope_scaling.
    config["rope_parameters"] = rope
    if rope["rope_type"] != "default":
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in shapes
        config["mlp_bias"] = False
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                          ("pad_token_id", "padding_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{gguf_key}")
        if token_id is not None:
            config[key] = int(token_id)
    return config


def _rope_parameters(metadata: dict[str, Any], arch: str, rope_theta: float) -> dict[str, Any]:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return {"rope_type": "default", "rope_theta": rope_theta}
    if kind not in ("linear", "yarn"):
        raise GGUFConversionError(f"rope scaling type {kind!r} is not supported (only linear and yarn)")
    rope = {"rope_type": kind, "rope_theta": rope_theta,
            "factor": float(metadata[f"{arch}.rope.scaling.factor"])}
    original = metadata.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        rope["original_max_position_embeddings"] = int(original)
    return rope


def _hf_tensor_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        raise GGUFConversionError(f"unexpected GGUF tensor {gguf_name!r}")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK_TENSORS:
        return f"model.layers.{int(parts[1])}.{_BLOCK_TENSORS[parts[2]]}.{suffix}"
    raise GGUFConversionError(f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent in this converter")


def _unpermute_rotary(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's ``permute(weights, n_head, n_head_kv)`` on q/k projection rows.

    llama.cpp reshapes rows as ``(heads, 2, head_dim // 2)`` and swaps the last two axes;
    swapping them back restores the Hugging Face row order. Works for biases too.
    """
    half = weights.shape[0] // n_heads // 2
    restored = weights.reshape(n_heads, half, 2, *weights.shape[1:]).swapaxes(1, 2)
    return restored.reshape(weights.shape)


def _write_tensors(reader: GGUFReader, config: dict[str, Any], path: Path, dtype: str) -> None:
    import numpy as np
    import torch
    from gguf.quants import dequantize
    from safetensors.torch import save_file

    torch_dtype = getattr(torch, dtype)
    permute = config["model_type"] in _PERMUTED_ARCHITECTURES
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        # dequantize returns float32 (F16/BF16 included), already in row-major HF layout.
        weights = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        kind = tensor.name.split(".")[-2]
        if permute and kind in heads:
            weights = _unpermute_rotary(weights, heads[kind])
        # Unquantized tensors come back as read-only views of the memory-mapped file.
        weights = np.require(weights, requirements=["C_CONTIGUOUS", "WRITEABLE"])
        tensors[_hf_tensor_name(tensor.name)] = torch.from_numpy(weights).to(torch_dtype)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _generation_config(metadata: dict[str, Any]) -> dict[str, Any]:
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    # Chat models often end a turn with a separate end-of-turn token; generation should stop
    # on it as llama.cpp does.
    stops = [int(t) for t in (eos, metadata.get("tokenizer.ggml.eot_token_id")) if t is not None]
    stops = list(dict.fromkeys(stops))
    generation: dict[str, Any] = {"_from_model_config": True}
    if metadata.get("tokenizer.ggml.bos_token_id") is not None:
        generation["bos_token_id"] = int(metadata["tokenizer.ggml.bos_token_id"])
    if stops:
        generation["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    if metadata.get("tokenizer.ggml.padding_token_id") is not None:
        generation["pad_token_id"] = int(metadata["tokenizer.ggml.padding_token_id"])
    return generation


def _write_tokenizer(gguf_path: Path, metadata: dict[str, Any], config: dict[str, Any], out: Path) -> None:
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Naming the class directly, not AutoTokenizer: AutoTokenizer first parses the whole
    # GGUF again to build a config, which doubles the conversion time.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
    )
    if metadata.get("tokenizer.ggml.pre") in _DIGIT_SPLIT_PRE_TOKENIZERS:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    tokenizer.save_pretrained(str(out))

    # Rewrite tokenizer_config.json so that readers other than transformers >= 5 (forkless's
    # API server, older transformers) find the chat template and a class they know.
    config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    for key in ("is_local", "local_files_only", "name_or_path"):
        tokenizer_config.pop(key, None)
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    for flag in ("add_bos_token", "add_eos_token"):
        # Absent flags keep transformers' per-tokenizer-type default (sentencepiece adds BOS).
        if f"tokenizer.ggml.{flag}" in metadata:
            tokenizer_config[flag] = bool(metadata[f"tokenizer.ggml.{flag}"])
    chat_template = metadata.get("tokenizer.chat_template")
    if chat_template:
        tokenizer_config["chat_template"] = chat_template
    _write_json(config_path, tokenizer_config)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
