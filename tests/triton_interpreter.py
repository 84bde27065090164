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


def run_interpreted(script: str, done: str) -> None:
    """Run ``script`` with ``TRITON_INTERPRET=1`` (no GPU visible) from the repository root;
    it must exit 0 and print ``done`` when all its checks have passed."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert done in proc.stdout
