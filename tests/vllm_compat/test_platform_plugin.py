"""A platform plugin written the way vLLM's are, imports and entry-point group renamed only,
is selected by forkless and generates on the CPU, offline and served.

``vllm_style_platform/`` is a real package, pip-installed into its own site directory. Its
detector (in the ``forkless.platform_plugins`` group) returns one of two platforms: a
CPU-like one that subclasses ``CpuPlatform`` and sets ``parallel_config.worker_cls`` in
``check_and_update_config``, and vLLM's dummy platform, which subclasses ``Platform``
and only returns its attention backend. Each hook appends a line to a record file, so the
tests see which ran, in which process, with which arguments.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import httpx
import pytest

from forkless.platforms import Platform, PlatformEnum
from forkless.platforms.interface import AttentionSelectorConfig
from tests.conftest import install_packages, plugin_env, run_python
from tests.server.conftest import start_server

PACKAGE = Path(__file__).resolve().parent / "vllm_style_platform"
SOURCES = [PACKAGE / "vllm_style_platform" / name for name in ("__init__.py", "platform.py")]
ATTENTION = "vllm_style_platform.attention.VllmStyleAttentionBackend"
# Where vLLM's platform plugins import from; the samples' forkless imports, renamed back.
VLLM_PATHS = {"vllm.platforms", "vllm.platforms.interface", "vllm.platforms.cpu", "vllm.logger"}

_OFFLINE = (
    "from forkless import LLM, SamplingParams\n"
    "from forkless.platforms import current_platform\n"
    "llm = LLM(model=MODEL, max_model_len=128)\n"
    "out = llm.generate(['Hello'], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)\n"
    "print('PLATFORM', type(current_platform).__name__, current_platform.is_out_of_tree())\n"
    "print('TOKENS', len(out[0].outputs[0].token_ids))\n"
    "llm.shutdown()\n"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("vllm-style-site")
    install_packages(target, [PACKAGE])
    return target


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def by_hook(recs: list[dict], hook: str) -> list[dict]:
    return [r for r in recs if r["hook"] == hook]


def test_the_samples_import_only_vllms_paths_renamed() -> None:
    for source in SOURCES:
        found = set()
        for node in ast.walk(ast.parse(source.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found |= {"vllm" + n[len("forkless"):] for n in names if n.startswith("forkless")}
        assert found <= VLLM_PATHS, (source.name, found - VLLM_PATHS)


@pytest.mark.parametrize(("kind", "cls_name", "worker_hook"),
                         [("cpu", "VllmStyleCpuPlatform", True), ("dummy", "DummyStylePlatform", False)])
def test_offline_llm_generates_on_the_vllm_style_platform(
        kind: str, cls_name: str, worker_hook: bool, tiny_llama: Path, site: Path, tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    env = plugin_env(site, tmp_path, VLLM_STYLE_PLATFORM=kind, VLLM_STYLE_PLATFORM_RECORD=str(record))
    proc = run_python(_OFFLINE.replace("MODEL", repr(str(tiny_llama))), env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"PLATFORM {cls_name} True" in proc.stdout
    assert "TOKENS 4" in proc.stdout
    recs = records(record)
    # The configuration reached the platform with the worker still open ("auto", as in vLLM).
    assert [r["worker_cls"] for r in by_hook(recs, "check_and_update_config")] == ["auto"]
    # The worker asked the platform once, with vLLM's arguments and the values forkless knows.
    selections = by_hook(recs, "get_attn_backend_cls")
    assert len(selections) == 1, recs
    assert {k: v for k, v in selections[0].items() if k not in ("hook", "pid")} == {
        "selected_backend": None, "head_size": 16, "dtype": "torch.float32", "kv_cache_dtype": "auto",
        "block_size": 16, "use_mla": False, "attn_type": "decoder", "num_heads": 4}
    assert len(by_hook(recs, "attention.forward")) == 1  # the platform's backend ran
    # The CPU-like platform's worker ran; the dummy left "auto", which means forkless's worker.
    assert len(by_hook(recs, "worker.init_device")) == (1 if worker_hook else 0)
    device_name = "VllmStyleCPU" if kind == "cpu" else "DummyDevice"
    assert f"({device_name}), attention backend vllm_style ({ATTENTION})" in proc.stderr


def test_served_by_forkless_serve_with_the_config_made_in_the_api_server(
        tiny_llama: Path, site: Path, tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", site=site,
                       env_extra={"FORKLESS_PLUGINS": "vllm_style_platform",
                                  "VLLM_STYLE_PLATFORM_RECORD": str(record)})
    try:
        resp = httpx.post(srv.url + "/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 4
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
    recs = records(record)
    (config,) = by_hook(recs, "check_and_update_config")
    (worker,) = by_hook(recs, "worker.init_device")
    assert config["pid"] == srv.proc.pid  # the API server made the configuration...
    assert worker["pid"] != srv.proc.pid  # ...and the worker it chose ran in the engine
    assert len(by_hook(recs, "get_attn_backend_cls")) == 1


def test_the_detector_rules_still_apply(site: Path, tmp_path: Path) -> None:
    code = "from forkless.platforms import current_platform; print(type(current_platform).__name__)"
    forced = run_python(code, plugin_env(site, tmp_path, FORKLESS_PLATFORM="cpu"))
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.strip() == "CpuPlatform"  # FORKLESS_PLATFORM wins over a detector
    inactive = run_python(code, plugin_env(site, tmp_path, VLLM_STYLE_PLATFORM="none"))
    assert inactive.stdout.strip() == "CpuPlatform"  # a detector returning None: the built-in


def test_the_hooks_are_classmethods_callable_on_the_class_and_on_an_instance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PACKAGE))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the sample is imported here only
    from vllm_style_platform.platform import DummyStylePlatform, VllmStyleCpuPlatform

    from forkless.platforms.cpu import CpuPlatform

    assert issubclass(DummyStylePlatform, Platform) and DummyStylePlatform().is_out_of_tree()
    assert VllmStyleCpuPlatform().is_out_of_tree() and CpuPlatform().is_cpu()
    selector = AttentionSelectorConfig(head_size=64, dtype="float32", kv_cache_dtype="auto", block_size=16)
    for target in (VllmStyleCpuPlatform, VllmStyleCpuPlatform()):
        assert target.get_attn_backend_cls(None, attn_selector_config=selector, num_heads=8) == ATTENTION
    with pytest.raises(NotImplementedError, match="MLA"):
        VllmStyleCpuPlatform.get_attn_backend_cls(None, selector._replace(use_mla=True))
    # vLLM's total memory is what forkless sizes the KV cache from, free memory included.
    assert DummyStylePlatform.total_memory_bytes() == DummyStylePlatform.free_memory_bytes() == 2 << 30
    assert DummyStylePlatform().get_device_name() == "DummyDevice"
    assert PlatformEnum.OOT is DummyStylePlatform._enum


def test_vllms_other_hooks_exist_with_vllms_defaults() -> None:
    # A ported platform may call any of vLLM's hooks through super() or cls.
    import torch

    class Ported(Platform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            from forkless.platforms.interface import DeviceCapability

            return DeviceCapability(8, 9)

        @classmethod
        def check_if_supports_dtype(cls, dtype):
            super().check_if_supports_dtype(dtype)
            if dtype == torch.float16:
                raise ValueError("no float16 here")

    assert Ported.fp8_dtype() == torch.float8_e4m3fn and not Ported.is_fp8_fnuz()
    assert Ported.supported_dtypes[0] == torch.bfloat16 and Ported.get_infinity_values(torch.float32)[1] == float("inf")
    assert Ported.is_device_capability((8, 9)) and Ported.is_device_capability(89) and not Ported.is_device_capability(90)
    assert not Ported.use_custom_allreduce() and not Ported.is_sleep_mode_available()
    assert Ported.set_additional_forward_context() == {} and Ported.make_synced_weight_loader(len) is len
    Ported.check_if_supports_dtype(torch.bfloat16)
    with pytest.raises(ValueError, match="float16"):
        Ported.check_if_supports_dtype(torch.float16)
    with pytest.raises(NotImplementedError, match="punica"):
        Ported.get_punica_wrapper()
