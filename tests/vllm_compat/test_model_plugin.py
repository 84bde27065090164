"""A model plugin registered the way vLLM's docs register one (a general plugin calling
``ModelRegistry.register_model(arch, "pkg.mod:Class")``), used offline through ``LLM``
without the caller loading plugins first (serving it is tests/server/test_plugins_in_server.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tests.conftest import plugin_env, run_python

_OFFLINE = (
    "import sys\n"
    "from forkless import LLM, SamplingParams\n"
    "llm = LLM(model=sys.argv[1], max_model_len=128)\n"
    "out = llm.generate(['Hello'], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)\n"
    "print('TOKENS', len(out[0].outputs[0].token_ids))\n"
    "llm.shutdown()\n"
)


def test_offline_llm_serves_an_architecture_registered_by_a_plugin(
        tiny_llama: Path, plugin_site: Path, tmp_path: Path) -> None:
    folder = tmp_path / "toy-llama"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["ToyLlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    code = _OFFLINE.replace("sys.argv[1]", repr(str(folder)))
    proc = run_python(code, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TOKENS 3" in proc.stdout
    # Without the plugin, the same folder is refused with vLLM's wording.
    proc = run_python(code, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS=""), timeout=300)
    assert proc.returncode != 0
    assert "Model architectures ['ToyLlamaForCausalLM'] are not supported for now" in proc.stderr


class NotAModel:
    """Registered by mistake: no torch module."""


def test_a_class_forkless_cannot_build_is_refused_naming_the_registration(tiny_llama: Path, tmp_path: Path) -> None:
    import pytest
    import torch

    from forkless import LLM, ModelRegistry

    class TorchButVllm(torch.nn.Module):
        def __init__(self, *, vllm_config, prefix: str = "") -> None:
            super().__init__()

    for arch, target, fragment in (
            ("NotAModelForCausalLM", f"{__name__}:NotAModel", "expected a torch.nn.Module subclass"),
            ("VllmStyleForCausalLM", TorchButVllm, "constructor takes vLLM's (vllm_config, prefix)")):
        folder = tmp_path / arch
        shutil.copytree(tiny_llama, folder)
        config = json.loads((folder / "config.json").read_text())
        config["architectures"] = [arch]
        (folder / "config.json").write_text(json.dumps(config))
        ModelRegistry.register_model(arch, target)
        with pytest.raises(Exception, match=f"{arch} is registered as .*{re.escape(fragment)}"):
            LLM(str(folder), max_model_len=128, kv_cache_memory=8 << 20)
