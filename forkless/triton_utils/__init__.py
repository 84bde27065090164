"""Helpers shared by forkless's Triton kernels (attention, fused layer ops, the GEMV).

Triton is not imported here: each module below imports it, and only code that launches
Triton kernels imports them; :func:`triton_available` says whether they can be.
"""

import functools
import importlib.util


@functools.cache
def triton_available() -> bool:
    """Whether Triton can be imported (without importing it). Asked once a process: the
    bitmask's apply asks every constrained step, and a module lookup costs ~60 us."""
    return importlib.util.find_spec("triton") is not None

