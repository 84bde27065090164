"""The CPU kernels per instruction-set level: every level the running CPU supports is built
and checked against the torch reference, the level is chosen from the CPU's flags and can
be held lower with FORKLESS_CPU_ISA, and the engine's greedy tokens do not depend on it.

A level the CPU lacks is skipped, naming the CPU and the levels it has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from forkless import cpu_kernels
from forkless.attention import get_attention_backend
from forkless.models.layers.activation import SiluAndMul
from forkless.models.layers.cpu_linear import PackedLinear
from forkless.models.layers.norm import RMSNorm
from forkless.models.layers.rotary import RotaryEmbedding
from test_cpu_kernels import _paged_step

# What each level is built for: x86-64-v4's and v3's CPU flags (as /proc/cpuinfo names them).
_V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_PANEL_WIDTH = {"avx512": 64, "avx2": 24, "portable": 24}


def _lib_for(level: str):
    """The kernels of ``level``, or a skip naming what this CPU has."""
    if level not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU ({cpu_kernels.cpu_model()}) lacks {level}; it has "
                    f"{', '.join(cpu_kernels.supported_isas())}")
    lib = cpu_kernels.load_isa(level)
    assert lib is not None, f"the {level} CPU kernels did not build (see the log)"
    return lib


@pytest.fixture(params=cpu_kernels.ISA_LEVELS)
def level_lib(request, monkeypatch):
    """Each level in turn, as the kernels every CPU layer and backend loads."""
    lib = _lib_for(request.param)
    monkeypatch.setattr(cpu_kernels, "load", lambda: lib)
    return request.param, lib


def test_levels_follow_the_cpu_flags():
    flags = cpu_kernels.cpu_flags()
    have = cpu_kernels.supported_isas()
    assert have[-1] == "portable"
    is_x86 = os.uname().machine in ("x86_64", "AMD64")
    assert ("avx2" in have) == (is_x86 and _V3 <= flags)
    assert ("avx512" in have) == (is_x86 and _V4 <= flags)
    assert cpu_kernels.requested_isa() == have[0]  # auto: the best


@pytest.mark.parametrize("level", cpu_kernels.ISA_LEVELS)
def test_each_library_holds_its_level(level):
    lib = _lib_for(level)
    assert lib.forkless_cpu_kernels_isa().decode() == level == lib.isa
    assert lib.forkless_linear_panel_width() == _PANEL_WIDTH[level]


def test_a_cpu_without_avx512_gets_avx2_and_is_refused_avx512(monkeypatch):
    monkeypatch.setattr(cpu_kernels.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset(_V3 | {"sse2"}))
    assert cpu_kernels.supported_isas() == ("avx2", "portable")
    monkeypatch.setenv("FORKLESS_CPU_ISA", "auto")
    assert cpu_kernels.requested_isa() == "avx2"
    monkeypatch.setenv("FORKLESS_CPU_ISA", "AVX512")
    with pytest.raises(ValueError, match=r"FORKLESS_CPU_ISA='avx512'.*lacks it; it has avx2, portable"):
        cpu_kernels.requested_isa()
    with pytest.raises(ValueError, match="lacks it"):
        cpu_kernels.load_isa("avx512")
    monkeypatch.setattr(cpu_kernels.platform, "machine", lambda: "aarch64")
    assert cpu_kernels.supported_isas() == ("portable",)


def test_an_unknown_level_is_refused(monkeypatch):
    monkeypatch.setenv("FORKLESS_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match=r"'sse9' is not a level: expected auto or one of avx512, avx2, portable"):
        cpu_kernels.requested_isa()


# Panel counts 1 to 9 at both widths, and one layer large enough to be split over threads
# even with one row (which takes its panels four at a time).
@pytest.mark.parametrize("out_features,in_features", [(64, 8), (50, 13), (200, 576), (7, 1), (400, 64),
                                                      (4100, 1030)])
def test_packed_linear_matches_linear(level_lib, out_features, in_features):
    _, lib = level_lib
    torch.manual_seed(out_features)
    linear = torch.nn.Linear(in_features, out_features)
    packed = PackedLinear(linear.weight, linear.bias, lib=lib)
    assert packed.packed.shape[-1] == lib.forkless_linear_panel_width()
    assert torch.equal(packed.weight, linear.weight)
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 13, 130):  # every tile height, and a second row block
        x = torch.randn(rows, in_features)
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_gguf_int8_route_matches_its_reference(level_lib, qtype):
    """The GGUF kernels' int8 activations at every level (AVX512-VNNI's VPDPBUSD, AVX2's
    VPMADDUBSW or plain C, as the library names it), against the route's definition, over
    more blocks a row than one chunk of scales holds (K = 4,640: 145 blocks)."""
    import gguf
    from gguf.quants import quantize

    from forkless.models.layers.gguf_linear import GGUFLinear
    from tests.model_loader.tiny_gguf import int8_route_reference

    level, lib = level_lib
    flags = cpu_kernels.cpu_flags()
    route = lib.forkless_quant_i8_route().decode()
    want = ("plain C" if level == "portable" else "vpdpbusd (AVX512-VNNI)"
            if level == "avx512" and "avx512_vnni" in flags else "vpmaddubsw (AVX2)")
    assert route == want
    for n, k in ((9, 4640), (64, 96)):
        stored = quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(k)).numpy(),
                          gguf.GGMLQuantizationType[qtype])
        layer = GGUFLinear(qtype, stored, k, activations="int8")
        x = torch.randn(5, k)
        want_y = int8_route_reference(x, stored, qtype, k)
        torch.testing.assert_close(layer(x), want_y, rtol=1e-5, atol=1e-4 * want_y.abs().max().item())


@pytest.mark.parametrize("hq,hkv,d,bs", [(9, 3, 64, 16), (16, 2, 128, 16), (10, 2, 80, 5), (6, 2, 20, 4),
                                         (8, 2, 40, 4)])
def test_attention_matches_reference(level_lib, hq, hkv, d, bs):
    # decodes, a fresh prefill, chunks over cached context (one and several query tiles,
    # a long context split over threads).
    seqs = [(7, 1), (0, 9), (1, 2), (3 * bs + 5, 40), (300, 1), (613, 170), (1500, 4)]
    cache, md, q, k, v = _paged_step(hq, hkv, d, bs, seqs)
    ref_cache, cpu_cache = cache.clone(), cache.clone()
    ref = get_attention_backend("torch")(hq, hkv, d, d**-0.5).forward(q, k, v, ref_cache, md())
    cpu_md = md()
    out = get_attention_backend("cpu")(hq, hkv, d, d**-0.5).forward(q, k, v, cpu_cache, cpu_md)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu_cache, ref_cache, rtol=0, atol=0)
    kp = cpu_md.backend_state["cpu"]
    assert kp.plan.decode_ids and kp.plan.context_ids  # both kernels ran


@pytest.mark.parametrize("hq,hkv,d,bs", [(9, 3, 64, 16), (16, 2, 128, 16), (6, 2, 20, 4)])
def test_bfloat16_attention_matches_reference(level_lib, hq, hkv, d, bs):
    """A bfloat16 cache: decode and prefill (fresh and over cached context) on the kernels
    (float32 sums)."""
    seqs = [(7, 1), (0, 9), (1, 2), (3 * bs + 5, 1), (300, 1), (613, 17)]
    cache, md, q, k, v = _paged_step(hq, hkv, d, bs, seqs)
    cache, q, k, v = (t.bfloat16() for t in (cache, q, k, v))
    ref_cache, cpu_cache = cache.clone(), cache.clone()
    ref = get_attention_backend("torch")(hq, hkv, d, d**-0.5).forward(q, k, v, ref_cache, md())
    # The same inputs in float32: the kernel's sums are float32, so it is closer to this.
    exact = get_attention_backend("torch")(hq, hkv, d, d**-0.5).forward(
        q.float(), k.float(), v.float(), cache.float(), md())
    cpu_md = md()
    out = get_attention_backend("cpu")(hq, hkv, d, d**-0.5).forward(q, k, v, cpu_cache, cpu_md)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(cpu_cache, ref_cache, rtol=0, atol=0)
    torch.testing.assert_close(out.float(), exact, rtol=8e-3, atol=8e-3)  # one bfloat16 rounding
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    kp = cpu_md.backend_state["cpu"]
    assert kp.plan.decode_ids == [0, 3, 4] and kp.plan.context_ids == [1, 2, 5] and not kp.plan.prefills


def test_fused_layer_ops_match_pytorch_layers(level_lib, ops_on_cpu, monkeypatch):
    # ops_on_cpu binds the kernels after level_lib patched load(): fused_cpu calls the patched one.
    torch.manual_seed(0)
    rows, n = 37, 200  # not a multiple of either vector width: the tails run too
    x = torch.randn(rows, 2 * n) * 8
    residual = torch.randn(rows, n)
    weight = torch.randn(n)
    qkv = torch.randn(rows, (4 + 2 + 2) * 48)
    positions = torch.randint(0, 500, (rows,))

    def run(implementation):
        norm = RMSNorm(n, eps=1e-6)
        norm.weight.data.copy_(weight)
        act = SiluAndMul()
        rope = RotaryEmbedding(48, {"rope_type": "default", "rope_theta": 10000.0})
        assert {norm.implementation, act.implementation, rope.implementation} == {implementation}
        buf = qkv.clone()
        rq, rk = rope(positions, buf[:, : 4 * 48].reshape(rows, 4, 48), buf[:, 4 * 48 : 6 * 48].reshape(rows, 2, 48))
        return (norm(x[:, :n]), *norm(x[:, n:], residual), act(x), rq, rk)

    fused = run("forward_cpu")
    monkeypatch.setenv("FORKLESS_FUSED_KERNELS", "0")
    plain = run("forward_native")
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


_GREEDY = """
import json
from forkless import LLM, SamplingParams, cpu_kernels
llm = LLM({model!r}, max_model_len=256, num_threads=2, kv_cache_memory=64 << 20)
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
print("RESULT " + json.dumps({{"isa": cpu_kernels.isa(), "tokens": [o.outputs[0].token_ids for o in outs]}}))
llm.shutdown()
"""


def test_engine_greedy_tokens_are_the_same_at_every_level(smollm2_folder: Path):
    levels = [level for level in ("avx512", "avx2") if level in cpu_kernels.supported_isas()]
    if len(levels) < 2:
        pytest.skip(f"this CPU ({cpu_kernels.cpu_model()}) has only {', '.join(cpu_kernels.supported_isas())}: "
                    "nothing to compare")
    results = {}
    for level in levels:
        env = {**os.environ, "FORKLESS_CPU_ISA": level, "FORKLESS_CACHE_ROOT": str(smollm2_folder.parent.parent)}
        proc = subprocess.run([sys.executable, "-c", _GREEDY.format(model=str(smollm2_folder))], env=env,
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
        # The level and the CPU are named in the log.
        assert f"CPU kernels: ISA {level} (FORKLESS_CPU_ISA" in proc.stderr + proc.stdout
        assert cpu_kernels.cpu_model() in proc.stderr + proc.stdout
        results[level] = json.loads(lines[-1][len("RESULT "):])
        assert results[level]["isa"] == level
        assert all(len(t) == 24 for t in results[level]["tokens"])
    assert results["avx512"]["tokens"] == results["avx2"]["tokens"]


def test_forced_level_the_cpu_lacks_fails_the_start_naming_it(tmp_path):
    """An engine asked for a level it cannot run stops with the reason, not a crash later."""
    missing = next((level for level in cpu_kernels.ISA_LEVELS if level not in cpu_kernels.supported_isas()), None)
    want = missing or "avx1024"
    code = "from forkless import cpu_kernels; cpu_kernels.load()"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FORKLESS_CPU_ISA": want},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"FORKLESS_CPU_ISA={want!r}" in proc.stderr
    assert ", ".join(cpu_kernels.supported_isas()) in proc.stderr or "expected auto or one of" in proc.stderr
