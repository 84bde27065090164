"""The CUDA platform's torch-free availability check (NVML + the torch build's version file)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from forkless.platforms.cuda import torch_has_cuda
from forkless.platforms.nvml import _apply_visible_devices, visible_gpu_count


@pytest.mark.parametrize(("visible", "expected"), [
    (None, 4), ("", 0), ("-1", 0), ("0", 1), ("3,1", 2), ("1,7,2", 1), ("GPU-8f1c,MIG-2", 2), ("0, 1", 2),
])
def test_cuda_visible_devices_as_the_runtime_reads_it(visible, expected) -> None:
    assert _apply_visible_devices(4, visible) == expected


def test_the_build_check_agrees_with_torch_without_importing_it() -> None:
    code = ("import sys; from forkless.platforms.cuda import torch_has_cuda; "
            "r = torch_has_cuda(); assert 'torch' not in sys.modules; print(r)")
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    import torch

    assert answer == str(torch.version.cuda is not None) == str(torch_has_cuda())


def test_nvml_count_is_a_count_or_no_answer() -> None:
    count = visible_gpu_count()
    assert count is None or count >= 0
