"""The CUDA platform's communicator: ``torch.distributed`` over NCCL.

Invariants: torch is the only dependency (NCCL comes with a CUDA build of torch); the
collectives run on the current CUDA stream, which is what lets a decode step's CUDA graph
capture them (the NCCL group is created, and warmed by one collective, before capture).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist

from forkless.distributed.interface import DeviceCommunicatorBase


class NcclCommunicator(DeviceCommunicatorBase):
    """Collectives between GPUs through NCCL (``torch.distributed``'s ``nccl`` backend)."""

    supports_cuda_graphs: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # DeviceCommunicatorBase's arguments
        super().__init__(*args, **kwargs)
        if self.device.type != "cuda":
            raise ValueError(f"NcclCommunicator needs a CUDA device, got {self.device}")
        # NCCL makes its communicator lazily, on the first collective: do it now, outside
        # any graph capture, with a tensor on this rank's device.
        warm = torch.zeros(1, device=self.device)
        dist.all_reduce(warm, group=self.device_group)
        torch.cuda.synchronize(self.device)
