"""Programmatic dependent launch (PDL) for decode-sized Triton kernels on Hopper.

A CUDA kernel normally starts only once the kernel before it in the stream has ended, and
each launch then spends a microsecond or two getting its programs onto the SMs before any
of them does work; at batch 1 a decode step is hundreds of such kernels that each compute
for a few microseconds. Launched with PDL (sm_90+), a kernel's programs are placed as soon
as every program of the kernel before has called ``gdc_launch_dependents``, and wait in
``gdc_wait`` until that kernel has finished and its writes are visible: the launch
overlaps the kernel before instead of following it.

Invariants:
    * A kernel taking ``PDL`` calls :func:`pdl_enter` before its first read of anything
      an earlier kernel writes, and writes nothing before it: launched with PDL it never
      sees a half-written input, and a kernel after it never races its writes. Launched
      without PDL the two calls do nothing.
    * Only decode-sized launches use it (at most :data:`PDL_MAX_TOKENS` tokens): with
      thousands of programs, programs of the next kernel waiting in ``gdc_wait`` would hold
      SM slots that the running kernel's later waves need.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from forkless import envs

#: Launches of at most this many tokens (decode steps of small batches) use PDL.
PDL_MAX_TOKENS = 32


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Let the next kernel launch, then wait for the kernel before (see the invariants)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@functools.cache
def _has_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def use_pdl(device: torch.device, num_tokens: int) -> bool:
    """Whether a launch over ``num_tokens`` tokens on ``device`` should use PDL
    (``FORKLESS_CUDA_PDL=0``: never)."""
    return (num_tokens <= PDL_MAX_TOKENS and device.type == "cuda" and envs.FORKLESS_CUDA_PDL
            and _has_pdl(device.index if device.index is not None else torch.cuda.current_device()))
