"""A worker's process groups: the world, tensor-parallel (TP) and pipeline-parallel (PP).

Invariants:
    * Global rank = ``pp_rank * tp_size + tp_rank`` (vLLM's order): the ranks of one TP
      group are consecutive, those of one PP group are ``tp_size`` apart.
    * With one worker nothing is initialised: ``torch.distributed`` is never touched, no
      communicator exists, and every accessor returns a :class:`GroupCoordinator` of one
      rank whose collectives return their input unchanged (no copy, no call). Model code
      therefore asks ``get_tp_group().world_size`` and takes its one-rank path.
    * Every rank creates every group, in the same order (``torch.distributed.new_group``
      is itself a collective); it keeps the ones it belongs to.
    * Each group has a gloo ``cpu_group`` and a ``device_group`` on the platform's
      backend (the same group when that backend is gloo), and, with more than one rank,
      the platform's communicator over them.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Iterator

import torch

from forkless.logger import init_logger

if TYPE_CHECKING:
    from forkless.distributed.interface import DeviceCommunicatorBase

logger = init_logger(__name__)

# How long a rank waits for the others at start-up and in a collective: long enough for a
# slow model load on another rank, finite so a lost peer eventually fails the call.
_TIMEOUT = timedelta(minutes=30)


class GroupCoordinator:
    """One process group as this rank sees it, and its communicator.

    Args:
        ranks: The group's global ranks, in group order.
        rank: This process's global rank (one of ``ranks``).
        cpu_group: A gloo group of ``ranks`` (None for a one-rank group).
        device_group: The platform-backend group of ``ranks`` (None for one rank).
        communicator: The device communicator (None for one rank).
        name: ``"world"``, ``"tp"`` or ``"pp"``.

    Attributes:
        world_size: Ranks in the group.
        rank_in_group: This process's position in ``ranks``.
    """

    def __init__(self, ranks: list[int], rank: int, cpu_group=None, device_group=None,
                 communicator: DeviceCommunicatorBase | None = None, name: str = "") -> None:
        self.ranks = list(ranks)
        self.rank = rank
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(rank)
        self.cpu_group = cpu_group
        self.device_group = device_group
        self.communicator = communicator
        self.name = name

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """The sum over the group (``input_`` itself with one rank)."""
        if self.communicator is None:
            return input_
        return self.communicator.all_reduce(input_)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``input_`` concatenated along ``dim`` (``input_`` with one rank)."""
        if self.communicator is None:
            return input_
        return self.communicator.all_gather(input_, dim)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Concatenated along ``dim`` on rank ``dst`` of the group; None on the others."""
        if self.communicator is None:
            return input_
        return self.communicator.gather(input_, dst, dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The sum over the group, rank r keeping part r along ``dim``."""
        if self.communicator is None:
            return input_
        return self.communicator.reduce_scatter(input_, dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``tensor`` on every rank."""
        if self.communicator is None:
            return tensor
        return self.communicator.broadcast(tensor, src)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        """Send to rank ``dst`` of the group (default: the next one)."""
        if self.communicator is None:
            raise RuntimeError(f"send on the one-rank {self.name or 'process'} group: there is no peer")
        self.communicator.send(tensor, dst)

    def recv(self, size: torch.Size | tuple[int, ...], dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        """Receive from rank ``src`` of the group (default: the previous one)."""
        if self.communicator is None:
            raise RuntimeError(f"recv on the one-rank {self.name or 'process'} group: there is no peer")
        return self.communicator.recv(size, dtype, src)

    def __repr__(self) -> str:
        return f"GroupCoordinator({self.name!r}, ranks={self.ranks}, rank_in_group={self.rank_in_group})"


_SINGLE = GroupCoordinator([0], 0, name="single")
_WORLD: GroupCoordinator | None = None
_TP: GroupCoordinator | None = None
_PP: GroupCoordinator | None = None


def get_world_group() -> GroupCoordinator:
    """Every worker of the engine (one rank when nothing is initialised)."""
    return _WORLD or _SINGLE


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group (one rank when nothing is initialised)."""
    return _TP or _SINGLE


def get_pp_group() -> GroupCoordinator:
    """This rank's pipeline-parallel group (one rank when nothing is initialised)."""
    return _PP or _SINGLE


def get_tensor_model_parallel_world_size() -> int:
    """vLLM's name: ranks in this worker's TP group."""
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    """vLLM's name: this worker's rank in its TP group."""
    return get_tp_group().rank_in_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """vLLM's name: :meth:`GroupCoordinator.all_reduce` on the TP group."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """vLLM's name: :meth:`GroupCoordinator.all_gather` on the TP group."""
    return get_tp_group().all_gather(input_, dim)


def model_parallel_is_initialized() -> bool:
    """Whether :func:`init_parallel_state` built groups of more than one rank."""
    return _WORLD is not None


def tp_groups(tp_size: int, pp_size: int) -> list[list[int]]:
    """The global ranks of every TP group: consecutive runs of ``tp_size``."""
    return [[p * tp_size + t for t in range(tp_size)] for p in range(pp_size)]


def pp_groups(tp_size: int, pp_size: int) -> list[list[int]]:
    """The global ranks of every PP group: one rank of each stage, ``tp_size`` apart."""
    return [[p * tp_size + t for p in range(pp_size)] for t in range(tp_size)]


def _new_group(all_ranks: list[list[int]], rank: int, backend: str, communicator_cls: type | None,
               device: torch.device, name: str) -> GroupCoordinator:
    import torch.distributed as dist

    mine: GroupCoordinator | None = None
    for ranks in all_ranks:  # every rank makes every group, in the same order
        cpu_group = dist.new_group(ranks, backend="gloo", timeout=_TIMEOUT)
        device_group = cpu_group if backend == "gloo" else dist.new_group(ranks, backend=backend, timeout=_TIMEOUT)
        if rank in ranks:
            communicator = None
            if len(ranks) > 1 and communicator_cls is not None:
                communicator = communicator_cls(cpu_group, device, device_group, name)
            mine = GroupCoordinator(ranks, rank, cpu_group, device_group, communicator, name)
    assert mine is not None, f"rank {rank} is in no {name} group of {all_ranks}"
    return mine


def init_parallel_state(*, world_size: int, rank: int, tensor_parallel_size: int, pipeline_parallel_size: int,
                        init_method: str | None, device: torch.device, dist_backend: str,
                        communicator: str | type | None) -> None:
    """Join the engine's workers and build the world, TP and PP groups.

    Does nothing with one worker (see the module's invariants).

    Args:
        world_size: Workers in the engine (``tensor_parallel_size * pipeline_parallel_size``).
        rank: This worker's global rank.
        tensor_parallel_size: Ranks per TP group.
        pipeline_parallel_size: Stages.
        init_method: The rendezvous (``tcp://host:port``), required with several workers.
        device: This rank's device.
        dist_backend: The platform's ``torch.distributed`` backend (``gloo``, ``nccl``).
        communicator: The platform's communicator (a registered name or class path; empty:
            the built-in named by ``dist_backend``).

    Raises:
        ValueError: Inconsistent sizes, or a missing rendezvous.
    """
    global _WORLD, _TP, _PP
    if tensor_parallel_size * pipeline_parallel_size != world_size:
        raise ValueError(f"world size {world_size} != tensor parallel {tensor_parallel_size} x pipeline "
                         f"parallel {pipeline_parallel_size}")
    if world_size == 1:
        return
    if init_method is None:
        raise ValueError(f"{world_size} workers need a rendezvous address (distributed_init_method)")
    import torch.distributed as dist

    from forkless.distributed.registry import resolve_device_communicator

    cls = resolve_device_communicator(communicator or "", dist_backend)
    backend = dist_backend or "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", init_method=init_method, world_size=world_size, rank=rank,
                                timeout=_TIMEOUT)
    _WORLD = _new_group([list(range(world_size))], rank, backend, cls, device, "world")
    _TP = _new_group(tp_groups(tensor_parallel_size, pipeline_parallel_size), rank, backend, cls, device, "tp")
    _PP = _new_group(pp_groups(tensor_parallel_size, pipeline_parallel_size), rank, backend, cls, device, "pp")
    logger.info("rank %d of %d: TP rank %d of %d, PP rank %d of %d, communicator %s over %s", rank, world_size,
                _TP.rank_in_group, _TP.world_size, _PP.rank_in_group, _PP.world_size, cls.__name__, backend)


@contextmanager
def replicated_model() -> Iterator[None]:
    """Build and load a model whole inside: the TP and PP accessors return the one-rank
    group, so every rank holds all of it and runs it alone, with no collective (a draft
    model next to a split target). Models read the groups when built and keep them."""
    global _TP, _PP
    saved = _TP, _PP
    _TP = _PP = None
    try:
        yield
    finally:
        _TP, _PP = saved


def destroy_parallel_state() -> None:
    """Drop the groups and leave ``torch.distributed`` (idempotent)."""
    global _WORLD, _TP, _PP
    for group in (_WORLD, _TP, _PP):
        if group is not None and group.communicator is not None:
            group.communicator.destroy()
    _WORLD = _TP = _PP = None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
