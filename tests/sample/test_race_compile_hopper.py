"""The sampler's race kernels compile for a Hopper GPU (sm_90) on a machine without one.

The interpreter (``test_race_triton.py``) runs their Python, not Triton's compiler, and CI
has no GPU; the kernels' flags pick which passes a launch compiles (top-k's candidate list
or radix select, top-p's rounds, min_p's max pass, per-row seeds), so each launch a step
may make must compile. Logits as a model gives them: bf16 (the radix select skips their
keys' low 16 bits) and float32 (a sampler's processed copy).
"""

from __future__ import annotations

import pytest

from forkless.triton_utils import triton_available
from tests.attention.test_triton_compile_hopper import _compile

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton is not installed")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("top_k, top_p, min_p, cap", [
    (True, True, True, 2048),    # Qwen3's defaults with min_p, through the candidate list
    (True, False, False, 0),     # the radix select alone
    (False, True, True, 0),      # top-p after min_p, no top-k: every pass over the row
])
def test_filtered_race_compiles_for_sm90(dtype: str, top_k: bool, top_p: bool, min_p: bool, cap: int) -> None:
    from forkless.sample.race_triton import MAX_ROUNDS, _filtered_race_kernel
    from forkless.sampling_params import SAMPLING_EPS

    types = {"x_ptr": f"*{dtype}", "temp_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32",
             "min_p_ptr": "*fp32", "row_seed_ptr": "*i64", "cand_val_ptr": "*fp32", "cand_idx_ptr": "*i32",
             "out_ptr": "*i64", "seed": "i64"}
    compiled = _compile(_filtered_race_kernel, types, dict(
        HAS_TOP_K=top_k, HAS_TOP_P=top_p, HAS_MIN_P=min_p, HAS_ROW_SEEDS=True, EPS=SAMPLING_EPS,
        TINY=1.1754943508222875e-38, BLOCK=1024, MAX_ROUNDS=MAX_ROUNDS, CAP=cap, SUB=128), num_warps=8, num_stages=3)
    assert "ld.global" in compiled.asm["ptx"]
