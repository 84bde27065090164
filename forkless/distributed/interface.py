"""The device-communicator extension point (provisional): collectives between workers.

A platform names its communicator with ``Platform.get_device_communicator_cls()``; each
worker of a multi-worker engine builds one per process group (the tensor-parallel group
today) in ``Worker.init_device()``, after ``torch.distributed`` is initialised.

Invariants:
    * A communicator is never created for a group of one rank: every caller
      (``forkless.distributed.parallel_state``) short-circuits world size 1, so a
      one-worker engine runs no collective and allocates nothing for one.
    * Every method is called by every rank of the group in the same order (they are
      collectives); ``send``/``recv`` pair a sender with a receiver.
    * Ranks passed in (``dst``, ``src``) are ranks *within the group*, as vLLM's.
    * The base class is a complete implementation over ``torch.distributed`` on
      :attr:`DeviceCommunicatorBase.device_group`, so a subclass overrides only what its
      device does better (a custom all-reduce kernel, logging, counting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.distributed as dist

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# torch 2.13 renamed the tensor forms of all-gather and reduce-scatter (the old names warn).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@stability(Stability.PROVISIONAL)
class DeviceCommunicatorBase:
    """Collective operations among the ranks of one process group, on one device.

    Args:
        cpu_group: A gloo group of the same ranks, for host-side coordination.
        device: This rank's device (the CPU when not given).
        device_group: The group the collectives run on (the platform's
            ``dist_backend``: gloo on the CPU, NCCL on CUDA); ``cpu_group`` when not given.
        unique_name: The group's name (``"tp"``, ``"pp"``, ``"world"``), for logs.

    Attributes:
        rank_in_group: This process's rank within the group (0 .. world_size - 1).
        world_size: Ranks in the group.
        ranks: The global ranks of the group, by rank in the group.
    """

    #: Whether the collectives may be captured in a CUDA graph (replayed without Python).
    supports_cuda_graphs: ClassVar[bool] = False
    #: Whether ``all_reduce`` may return ``input_`` itself, reduced in place (callers must
    #: then not reuse the input); out-of-place implementations leave it False.
    all_reduce_in_place: ClassVar[bool] = True

    def __init__(
        self,
        cpu_group: ProcessGroup,
        device: torch.device | None = None,
        device_group: ProcessGroup | None = None,
        unique_name: str = "",
    ) -> None:
        self.device = device if device is not None else torch.device("cpu")
        self.cpu_group = cpu_group
        self.device_group = device_group if device_group is not None else cpu_group
        self.unique_name = unique_name
        self.ranks: list[int] = dist.get_process_group_ranks(cpu_group)
        self.world_size = len(self.ranks)
        self.global_rank = dist.get_rank()
        self.rank_in_group = self.ranks.index(self.global_rank)

    # ------------------------------------------------------------------ collectives

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``input_`` over the group (in place: see
        :attr:`all_reduce_in_place`)."""
        if not input_.is_contiguous():  # a packed CPU linear's output may be a column slice
            input_ = input_.contiguous()
        dist.all_reduce(input_, group=self.device_group)
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``input_`` concatenated along ``dim``, in rank order, on every rank."""
        dim = dim % input_.dim()
        # Concatenated along dim 0 (the form every backend takes), then moved to ``dim``.
        out = torch.empty((self.world_size * input_.shape[0],) + tuple(input_.shape[1:]), dtype=input_.dtype,
                          device=input_.device)
        _all_gather_single(out, input_.contiguous(), group=self.device_group)
        if dim == 0:
            return out
        # [world * d0, ...] -> [world, d0, ..., d, ...] -> [d0, ..., world, d, ...] -> [..., world * d, ...]
        out = out.reshape((self.world_size,) + tuple(input_.shape)).movedim(0, dim)
        shape = list(input_.shape)
        shape[dim] *= self.world_size
        return out.reshape(shape)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Every rank's ``input_`` concatenated along ``dim`` on rank ``dst`` (None elsewhere)."""
        dim = dim % input_.dim()
        parts = ([torch.empty_like(input_) for _ in range(self.world_size)]
                 if self.rank_in_group == dst else None)
        dist.gather(input_.contiguous(), parts, dst=self.ranks[dst], group=self.device_group)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The sum over the group of ``input_``, split along ``dim``: rank r keeps part r.

        Raises:
            ValueError: ``input_.shape[dim]`` is not a multiple of the group's size.
        """
        dim = dim % input_.dim()
        if input_.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: dimension {dim} of shape {tuple(input_.shape)} does not "
                             f"split into {self.world_size} equal parts")
        moved = input_.movedim(dim, 0).contiguous()
        out = torch.empty((moved.shape[0] // self.world_size,) + tuple(moved.shape[1:]),
                          dtype=input_.dtype, device=input_.device)
        if self.device_group is not None and dist.get_backend(self.device_group) == "gloo":
            # gloo has no reduce_scatter: reduce everything, keep this rank's part.
            dist.all_reduce(moved, group=self.device_group)
            out.copy_(moved.chunk(self.world_size)[self.rank_in_group])
        else:
            _reduce_scatter_single(out, moved, group=self.device_group)
        return out.movedim(0, dim).contiguous()

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        """Send ``tensor`` to rank ``dst`` of the group (default: the next rank), blocking."""
        if dst is None:
            dst = (self.rank_in_group + 1) % self.world_size
        dist.send(tensor.contiguous(), self.ranks[dst], group=self.device_group)

    def recv(self, size: torch.Size | tuple[int, ...], dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        """Receive a tensor of ``size`` and ``dtype`` from rank ``src`` (default: the previous rank)."""
        if src is None:
            src = (self.rank_in_group - 1) % self.world_size
        tensor = torch.empty(size, dtype=dtype, device=self.device)
        dist.recv(tensor, self.ranks[src], group=self.device_group)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``tensor`` of rank ``src`` on every rank (filled in place elsewhere)."""
        dist.broadcast(tensor, self.ranks[src], group=self.device_group)
        return tensor

    def destroy(self) -> None:
        """Release what the communicator holds (the groups belong to the parallel state)."""
