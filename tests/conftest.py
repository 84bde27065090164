"""Shared fixtures: the example plugin packages, installed for real, and a CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "plugins"


def install_packages(target: Path, packages: list[Path]) -> None:
    """``pip install`` packages into a site directory (discovered via ``PYTHONPATH``)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-index", "--target", str(target),
         *map(str, packages)],
        check=True,
    )


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory with every example plugin package under examples/plugins/ installed."""
    target = tmp_path_factory.mktemp("plugin-site")
    install_packages(target, sorted(p for p in EXAMPLES.iterdir() if (p / "pyproject.toml").exists()))
    return target


@pytest.fixture(scope="session", autouse=True)
def shared_kernel_cache(tmp_path_factory: pytest.TempPathFactory):
    """One build of the CPU kernels for the whole session, whatever each test's cache root."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKLESS_KERNEL_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        yield


def plugin_env(site: Path | None, tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """A clean environment for a forkless subprocess that sees the plugins in ``site``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FORKLESS_") or k == "FORKLESS_KERNEL_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site) if site else "", env.get("PYTHONPATH", "")) if p)
    env["FORKLESS_CACHE_ROOT"] = str(tmp_path / "cache")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_forkless(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once per session (~10 s) into its own cache root.

    The cache root is ``smollm2_folder.parent.parent``.
    """
    from forkless.model_loader.default_model import default_model_path

    root = tmp_path_factory.mktemp("smollm2-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKLESS_CACHE_ROOT", str(root))
        return default_model_path()


def make_tiny_model(out: Path, tokenizer_from: Path, arch: str = "llama", seed: int = 0,
                    max_position_embeddings: int = 512) -> Path:
    """A tiny random-weight model folder with a real tokenizer and chat template.

    Args:
        out: The folder to write.
        tokenizer_from: A model folder whose tokenizer files are copied (SmolLM2's).
        arch: ``"llama"`` or ``"qwen3"``.
        seed: Seeds the random weights.
        max_position_embeddings: The model's context length.
    """
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    cfg = LlamaConfig(**common) if arch == "llama" else Qwen3Config(head_dim=16, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger logits than the default init, so greedy text varies
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else None
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="session")
def tiny_llama(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer: fast enough for server tests."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), smollm2_folder)


@pytest.fixture
def ops_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer ops pick their implementation by platform: the CPU's, even on a GPU host,
    with the C kernels loaded first, as the model runner does."""
    from forkless import platforms
    from forkless.ops import kernels
    from forkless.platforms.cpu import CpuPlatform

    if not platforms.current_platform.is_cpu():
        monkeypatch.setattr(platforms, "_current", CpuPlatform())
    assert kernels.cpu_kernels() is not None, "the CPU kernels did not build (see the log)"


THINK_TOKENS = {11: "<think>", 12: "</think>"}  # (SmolLM2's <jupyter_start> and <jupyter_text>)


@pytest.fixture(scope="session")
def tiny_thinker(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama whose tokenizer has ``<think>`` and ``</think>`` as single,
    non-special tokens (as Qwen3's has): SmolLM2's, with two unused added tokens renamed."""
    import shutil

    tokenizer = tmp_path_factory.mktemp("thinker-tokenizer")
    for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "config.json"):
        if (smollm2_folder / name).exists():
            shutil.copy(smollm2_folder / name, tokenizer / name)
    spec = json.loads((smollm2_folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    for entry in spec["added_tokens"]:
        if entry["id"] in THINK_TOKENS:
            del vocab[entry["content"]]
            entry["content"], entry["special"] = THINK_TOKENS[entry["id"]], False
            vocab[entry["content"]] = entry["id"]
    (tokenizer / "tokenizer.json").write_text(json.dumps(spec))
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    for key, entry in config.get("added_tokens_decoder", {}).items():
        if int(key) in THINK_TOKENS:
            entry["content"], entry["special"] = THINK_TOKENS[int(key)], False
    config["additional_special_tokens"] = [t for t in config.get("additional_special_tokens", [])
                                           if t not in ("<jupyter_start>", "<jupyter_text>")]
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    special = tokenizer / "special_tokens_map.json"
    if special.exists():
        data = json.loads(special.read_text())
        data["additional_special_tokens"] = [t for t in data.get("additional_special_tokens", [])
                                             if (t if isinstance(t, str) else t.get("content"))
                                             not in ("<jupyter_start>", "<jupyter_text>")]
        special.write_text(json.dumps(data))
    return make_tiny_model(tmp_path_factory.mktemp("tiny-thinker"), tokenizer)
