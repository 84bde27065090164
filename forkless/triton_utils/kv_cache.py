"""What a KV-cache store writes, shared by the attention backend's store kernel and the
rotary kernels that store the keys and values themselves.

Invariant: an fp8 (e4m3) cache holds ``x * inv_scale`` saturated at the format's largest
finite value (+-448) instead of overflowing to NaN; any other cache holds ``x`` in its
dtype. The torch reference backend (``torch_sdpa.py``) stores the same values.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Largest finite float8_e4m3fn value: fp8 stores saturate here.
FP8_E4M3_MAX = 448.0


@triton.jit
def cache_value(x, inv_scale, cache_ptr, KV_FP8: tl.constexpr):
    """``x`` as the cache at ``cache_ptr`` stores it (see the invariant)."""
    if KV_FP8:
        x = tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0)  # FP8_E4M3_MAX: jit code reads no globals
    return x.to(cache_ptr.dtype.element_ty)
