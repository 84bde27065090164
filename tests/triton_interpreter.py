"""Running Triton kernels on the CPU, under Triton's interpreter, for CI (which has no GPU).

``TRITON_INTERPRET`` must be set before Triton is imported, so each check runs as a script
in a child process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkless.triton_utils import triton_available

ROOT = Path(__file__).resolve().parents[1]

#: Skips a test where Triton is not installed.
needs_triton = pytest.mark.skipif(not triton_available(), reason="Triton is not installed")


# Two pure costs of Triton's interpreter, taken out before a script runs (what runs is the
# same): it re-patches ``triton.language`` (an ``inspect.getmembers`` scan of four modules)
# at every call of a ``@triton.jit`` helper from inside a kernel, although the launch
# around it has patched the same modules already and restores them at its end; and it
# rebuilds a table of NumPy dtypes at every operation. Both were ~45 % of the race tests'
# time.
_PRELUDE = """
import inspect as _inspect
import triton.language as _tl
import triton.runtime.interpreter as _interp

if hasattr(_interp, "_patch_lang") and hasattr(_interp, "_LangPatchScope"):
    _patch_lang, _langs_of = _interp._patch_lang, {}

    def _patch_lang_once(fn):
        langs = _langs_of.get(fn)
        if langs is None:
            langs = _langs_of[fn] = [v for v in fn.__globals__.values()
                                     if _inspect.ismodule(v) and v in (_tl, _tl.core)]
        if langs and not any(_tl.core.is_builtin(getattr(lang, "load", None)) for lang in langs):
            return _interp._LangPatchScope()  # patched by the launch this call runs inside
        return _patch_lang(fn)

    _interp._patch_lang = _patch_lang_once
if hasattr(_interp, "_get_np_dtype"):
    _get_np_dtype, _np_dtypes = _interp._get_np_dtype, {}

    def _get_np_dtype_cached(tt_dtype):
        try:
            return _np_dtypes[tt_dtype]
        except KeyError:
            found = _np_dtypes[tt_dtype] = _get_np_dtype(tt_dtype)
            return found
        except TypeError:  # an unhashable type (a block's): not cached
            return _get_np_dtype(tt_dtype)

    _interp._get_np_dtype = _get_np_dtype_cached
"""


class InterpretedRun:
    """``script`` started with ``TRITON_INTERPRET=1`` (no GPU visible) from the repository
    root, in a child process, without waiting: a test module starts all its scripts at
    once, so the interpreter, a single Python thread, runs on each of the machine's cores
    while the first is checked."""

    def __init__(self, script: str) -> None:
        # One thread each: several runs share the machine's cores.
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="",
                   OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", _PRELUDE + script], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def check(self, done: str, timeout: float = 300) -> None:
        """Wait for the script: it must exit 0 and print ``done`` when all its checks have passed."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        assert self.proc.returncode == 0, err[-3000:]
        assert done in out

    def stop(self) -> None:
        """Kill the script if it still runs (a test that never checked it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def run_interpreted(script: str, done: str) -> None:
    """Run ``script`` with ``TRITON_INTERPRET=1`` (no GPU visible) from the repository root;
    it must exit 0 and print ``done`` when all its checks have passed."""
    InterpretedRun(script).check(done)
