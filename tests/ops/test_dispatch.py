"""Custom ops on the CPU platform: which implementation each op binds, the registry's rules,
and the C kernels (forward_cpu) against plain PyTorch (forward_native)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from forkless import cpu_kernels
from forkless.ops import CustomOp, kernels, oot_ops, op_class, op_names, register_oot, unregister_oot
from forkless.ops.activation import SiluAndMul
from forkless.ops.layernorm import RMSNorm
from forkless.ops.rotary import RotaryEmbedding
from forkless.plugins import RegistryError

ROPE = {"rope_type": "default", "rope_theta": 10000.0}


# The CPU platform, also where this process would run on a GPU (the op tests are CPU's),
# with the C kernels loaded before the ops are built, as in a worker once its model runs.
pytestmark = pytest.mark.usefixtures("ops_on_cpu")


def _ops() -> list[CustomOp]:
    return [RMSNorm(64), RotaryEmbedding(32, ROPE), SiluAndMul()]


def test_builtin_ops_are_registered_by_name():
    builtins = ["rms_norm", "rotary_embedding", "silu_and_mul"]
    assert set(builtins) <= set(op_names())
    assert [op_class(n) for n in builtins] == [RMSNorm, RotaryEmbedding, SiluAndMul]
    assert op_class("RMSNorm") is RMSNorm  # vLLM's spelling of the name
    # The old layer paths are the same classes.
    from forkless.models.layers.activation import SiluAndMul as OldSiluAndMul
    from forkless.models.layers.norm import RMSNorm as OldRMSNorm
    from forkless.models.layers.rotary import RotaryEmbedding as OldRotary

    assert (OldRMSNorm, OldRotary, OldSiluAndMul) == (RMSNorm, RotaryEmbedding, SiluAndMul)


def test_cpu_platform_binds_forward_cpu_as_the_forward_itself():
    for op in _ops():
        assert op.implementation == "forward_cpu"
        # No dispatch per call: nn.Module calls the bound kernel method directly.
        assert op.__dict__["forward"] == op.forward_cpu
        assert op.forward.__func__ is type(op).forward_cpu


def test_a_copied_op_runs_its_own_bound_method():
    import copy

    norm = RMSNorm(64)
    norm.weight.data.normal_()
    twin = copy.deepcopy(norm)
    assert twin.forward.__self__ is twin and twin.implementation == "forward_cpu"
    twin.weight.data.mul_(2)  # the copy's own weight, not the original's
    x = torch.randn(3, 64)
    torch.testing.assert_close(twin(x), norm(x) * 2)


def test_fused_kernels_off_binds_forward_native(monkeypatch):
    monkeypatch.setenv("FORKLESS_FUSED_KERNELS", "0")
    for op in _ops():
        assert op.implementation == "forward_native"
        assert op.forward.__func__ is type(op).forward_native


@pytest.mark.parametrize("custom_ops,fused,want", [
    ("-rms_norm", "1", {"rms_norm": "forward_native"}),
    ("-RMSNorm, -silu_and_mul", "1", {"rms_norm": "forward_native", "silu_and_mul": "forward_native"}),
    ("none,+silu_and_mul", "1", {"rms_norm": "forward_native", "rotary_embedding": "forward_native"}),
    ("+rotary_embedding", "0", {"rms_norm": "forward_native", "silu_and_mul": "forward_native"}),
    ("all,-rotary_embedding", "0", {"rotary_embedding": "forward_native"}),
    ("", "1", {}),
])
def test_custom_ops_turns_ops_on_and_off_by_name(monkeypatch, custom_ops, fused, want):
    monkeypatch.setenv("FORKLESS_CUSTOM_OPS", custom_ops)
    monkeypatch.setenv("FORKLESS_FUSED_KERNELS", fused)
    got = {op.name: op.implementation for op in _ops()}
    assert got == {name: want.get(name, "forward_cpu") for name in got}


@pytest.mark.parametrize("custom_ops,message", [
    ("-rms_norn", "unknown custom op 'rms_norn'; custom ops: rms_norm, rotary_embedding, silu_and_mul"),
    ("rms_norm", "'rms_norm' is not 'all', 'none', '+op' or '-op'"),
    ("all,none", "both 'all' and 'none'"),
    ("+silu_and_mul,-SiluAndMul", "turns silu_and_mul both on and off"),
])
def test_a_bad_custom_ops_value_names_what_is_wrong(monkeypatch, custom_ops, message):
    monkeypatch.setenv("FORKLESS_CUSTOM_OPS", custom_ops)
    with pytest.raises(ValueError, match=re.escape(message)):
        SiluAndMul()


def test_without_the_c_kernels_forward_native_runs(monkeypatch):
    kernels.cpu_kernels.cache_clear()
    monkeypatch.setattr(cpu_kernels, "load", lambda: None)
    try:
        before = RMSNorm(64)  # built before anything asked for the kernels
        assert kernels.cpu_kernels() is None
        assert {op.implementation for op in _ops()} == {"forward_native"}
        x = torch.randn(2, 64)
        torch.testing.assert_close(before(x), before.forward_native(x))
        assert before.implementation == "forward_native"
    finally:
        monkeypatch.undo()
        kernels.cpu_kernels.cache_clear()


def test_building_an_op_does_not_load_the_c_kernels():
    # The model runner loads them after the weights; an op built before binds on first call.
    code = ("import torch; from forkless import cpu_kernels; from forkless.ops.layernorm import RMSNorm; "
            "n = RMSNorm(8); print(n.implementation, cpu_kernels.load.cache_info().currsize); "
            "x = torch.randn(2, 8); y = n(x); print(n.implementation, torch.allclose(y, n.forward_native(x)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["_load_cpu_kernels_then_bind", "0", "forward_cpu", "True"], out.stdout


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_forward_cpu_equals_forward_native(rows):
    torch.manual_seed(rows)
    norm = RMSNorm(96, eps=1e-5)
    norm.weight.data.normal_()
    x, residual = torch.randn(rows, 96), torch.randn(rows, 96)
    torch.testing.assert_close(norm.forward_cpu(x), norm.forward_native(x), rtol=1e-5, atol=1e-5)
    got, want = norm.forward_cpu(x, residual), norm.forward_native(x, residual)
    for a, b in zip(got, want):  # (normalised, x + residual)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    per_head = torch.randn(rows, 4, 96)  # Qwen3's q/k norm: [T, H, D]
    torch.testing.assert_close(norm.forward_cpu(per_head), norm.forward_native(per_head), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("rows", [1, 9, 300])
def test_rotary_forward_cpu_equals_forward_native(rows, partial):
    torch.manual_seed(rows)
    rope = RotaryEmbedding(64, {**ROPE, "partial_rotary_factor": partial})
    positions = torch.randint(0, 4000, (rows,))
    qkv = torch.randn(rows, (8 + 2 + 2) * 64)  # q and k as strided views of one projection

    def split(buf):
        return buf[:, : 8 * 64].view(rows, 8, 64), buf[:, 8 * 64 : 10 * 64].view(rows, 2, 64)

    want = rope.forward_native(positions, *split(qkv.clone()))
    got = rope.forward_cpu(positions, *split(qkv.clone()))  # in place
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 300])
def test_silu_and_mul_forward_cpu_equals_forward_native(rows):
    torch.manual_seed(rows)
    act = SiluAndMul()
    x = torch.randn(rows, 2 * 160) * 4
    torch.testing.assert_close(act.forward_cpu(x), act.forward_native(x), rtol=1e-5, atol=1e-6)


def test_forward_cpu_takes_native_path_for_bfloat16():
    # The C kernels are float32 only; a bfloat16 CPU model runs the PyTorch ops.
    torch.manual_seed(0)
    norm, act = RMSNorm(64, dtype=torch.bfloat16), SiluAndMul()
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(norm(x), norm.forward_native(x))
    assert torch.equal(act(x), act.forward_native(x))


class _CountingRMSNorm(RMSNorm):
    calls = 0

    def forward_cpu(self, x, residual=None):
        type(self).calls += 1
        return self.forward_native(x, residual)


@pytest.mark.parametrize("spelling", ["positional", "vllm_name", "vllm_call", "on_the_class"])
def test_register_oot_replaces_the_op_where_it_is_built(spelling):
    cls = type("Replacement", (_CountingRMSNorm,), {"calls": 0})
    if spelling == "positional":
        CustomOp.register_oot("rms_norm")(cls)
    elif spelling == "vllm_name":  # vLLM registers under the in-tree class name
        CustomOp.register_oot(name="RMSNorm")(cls)
    elif spelling == "vllm_call":
        CustomOp.register_oot(_decorated_op_cls=cls, name="RMSNorm")
    else:
        RMSNorm.register_oot(cls)
    try:
        assert cls.name == "rms_norm"
        assert oot_ops() == {"rms_norm": f"{cls.__module__}:{cls.__qualname__}"}
        norm = RMSNorm(64)  # what a model writes
        assert type(norm) is cls and norm.implementation == "forward_cpu"
        x = torch.randn(3, 64)
        torch.testing.assert_close(norm(x), RMSNorm.forward_native(norm, x))
        norm(x, x)
        assert cls.calls == 2
        # Other ops are untouched.
        assert type(SiluAndMul()) is SiluAndMul
    finally:
        unregister_oot("rms_norm")
    assert type(RMSNorm(64)) is RMSNorm


def test_registering_the_same_replacement_again_is_a_no_op(caplog):
    path = f"{__name__}:_CountingRMSNorm"
    register_oot("rms_norm", path)
    try:
        with caplog.at_level("WARNING"):
            register_oot("rms_norm", path)
            CustomOp.register_oot("rms_norm")(_CountingRMSNorm)  # its class, by object
        assert "replaced" not in caplog.text
        assert type(RMSNorm(8)) is _CountingRMSNorm
    finally:
        unregister_oot("rms_norm")


def test_register_oot_of_an_unknown_op_lists_the_op_names():
    with pytest.raises(RegistryError) as err:
        register_oot("rms_norn", "pkg.mod:Cls")
    assert "'rms_norn'" in str(err.value)
    for name in ("rms_norm", "rotary_embedding", "silu_and_mul", "RMSNorm"):
        assert name in str(err.value)
    with pytest.raises(RegistryError):
        @CustomOp.register_oot(name="LayerNorm")
        class _Nope(RMSNorm):
            pass
    assert oot_ops() == {}


def test_a_replacement_must_subclass_the_in_tree_op():
    register_oot("silu_and_mul", f"{__name__}:_CountingRMSNorm")
    try:
        with pytest.raises(TypeError, match="does not subclass forkless.ops.activation.SiluAndMul"):
            SiluAndMul()
    finally:
        unregister_oot("silu_and_mul")


def test_subclasses_that_are_not_registered_are_not_replaced():
    class Gemma(RMSNorm):  # another op built on RMSNorm, not RMSNorm itself
        pass

    CustomOp.register_oot("rms_norm")(_CountingRMSNorm)
    try:
        assert type(Gemma(8)) is Gemma
    finally:
        unregister_oot("rms_norm")


def test_in_tree_names_are_unique():
    with pytest.raises(ValueError, match="register_oot"):
        @CustomOp.register("silu_and_mul")
        class _Other(CustomOp):
            def forward_native(self, x):
                return x


def test_a_new_op_dispatches_like_the_builtins(monkeypatch):
    @CustomOp.register("test_scale_by_two")
    class Scale(CustomOp):
        def forward_native(self, x):
            return x * 2

    x = torch.ones(3)
    op = Scale()
    # No forward_cpu of its own: forward_native is bound directly (no default frame).
    assert op.implementation == "forward_native" and torch.equal(op(x), x * 2)
    assert "test_scale_by_two" in op_names()


def test_importing_forkless_ops_and_registering_by_path_needs_no_torch():
    code = ("import sys; from forkless.ops import register_oot, oot_ops; "
            "register_oot('SiluAndMul', 'pkg.mod:Mine'); print(oot_ops(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "{'silu_and_mul': 'pkg.mod:Mine'} False"


def test_compilation_config_custom_ops_choose_the_models_ops(tiny_llama, monkeypatch):
    # vLLM's --compilation-config '{"custom_ops": [...]}' reaches the ops the worker builds,
    # in place of FORKLESS_CUSTOM_OPS; the tokens stay those of the device kernels.
    from forkless import LLM, SamplingParams
    from forkless.config import EngineArgs

    monkeypatch.setenv("FORKLESS_CUSTOM_OPS", "none")  # replaced by the flag
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    runs = {}
    for name, cc in (("flag", {"custom_ops": ["none", "+silu_and_mul"]}), ("all", {"custom_ops": ["all"]})):
        llm = LLM(str(tiny_llama), compilation_config=cc, max_model_len=128, kv_cache_memory=8 << 20)
        try:
            model = llm.llm_engine.engine_core.executor.worker.model_runner.model
            runs[name] = ({type(m).__name__: m.implementation for m in model.modules() if isinstance(m, CustomOp)},
                          [list(o.outputs[0].token_ids) for o in llm.generate(["Hello there", "Paris is"], greedy)])
        finally:
            llm.shutdown()
    assert runs["flag"][0] == {"RMSNorm": "forward_native", "RotaryEmbedding": "forward_native",
                               "SiluAndMul": "forward_cpu"}
    assert set(runs["all"][0].values()) == {"forward_cpu"}
    assert runs["flag"][1] == runs["all"][1]
    with pytest.raises(ValueError, match="custom ops: rms_norm, rotary_embedding, silu_and_mul"):
        EngineArgs(model=str(tiny_llama), compilation_config={"custom_ops": ["-layer_norm"]}).create_engine_config()
    with pytest.raises(ValueError, match="'mode' is not supported: forkless reads only 'custom_ops' and "
                                         "'cudagraph_mode'"):
        EngineArgs(model=str(tiny_llama), compilation_config={"mode": 3}).create_engine_config()


def test_compilation_config_cudagraph_mode(tiny_llama):
    # vLLM's cudagraph_mode, by its enum names in any case; the default is vLLM's too.
    from forkless.config import EngineArgs

    def mode(cc):
        config = EngineArgs(model=str(tiny_llama), compilation_config=cc).create_engine_config()
        return None if config.compilation_config is None else config.compilation_config.cudagraph_mode

    assert mode(None) is None  # the runner then takes FULL_AND_PIECEWISE
    assert mode({}) == "FULL_AND_PIECEWISE"
    assert mode('{"cudagraph_mode": "full_decode_only"}') == "FULL_DECODE_ONLY"
    assert mode({"cudagraph_mode": "NONE", "custom_ops": ["all"]}) == "NONE"
    for bad in ("PIECEWISE", "FULL", "sometimes", 2):
        with pytest.raises(ValueError, match="cudagraph_mode must be one of NONE, FULL_DECODE_ONLY, "
                                             "FULL_AND_PIECEWISE, got"):
            EngineArgs(model=str(tiny_llama), compilation_config={"cudagraph_mode": bad}).create_engine_config()
