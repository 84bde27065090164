"""The example platform's own device communicator: gloo, counting and logging its calls.

A real platform would call its device's collective library here; this one keeps
forkless's gloo communicator and counts every call, so a test can see that the platform,
not forkless, chose the communicator that ran. It logs the first call of each kind and,
when the worker shuts down, the totals of its group.
"""

import logging
from collections import Counter

from forkless.distributed.gloo import GlooCommunicator

logger = logging.getLogger("forkless.example_platform")


class CountingGlooCommunicator(GlooCommunicator):
    """:class:`GlooCommunicator` with a per-instance count of calls by operation."""

    def __init__(self, cpu_group, device=None, device_group=None, unique_name=""):
        super().__init__(cpu_group, device, device_group, unique_name)
        self.calls: Counter[str] = Counter()

    def _count(self, op: str) -> None:
        if not self.calls[op]:
            logger.warning("example_cpu communicator: first %s (group %s, rank %d of %d)", op,
                           self.unique_name, self.rank_in_group, self.world_size)
        self.calls[op] += 1

    def all_reduce(self, input_):
        self._count("all_reduce")
        return super().all_reduce(input_)

    def all_gather(self, input_, dim=-1):
        self._count("all_gather")
        return super().all_gather(input_, dim)

    def gather(self, input_, dst=0, dim=-1):
        self._count("gather")
        return super().gather(input_, dst, dim)

    def reduce_scatter(self, input_, dim=-1):
        self._count("reduce_scatter")
        return super().reduce_scatter(input_, dim)

    def broadcast(self, tensor, src=0):
        self._count("broadcast")
        return super().broadcast(tensor, src)

    def send(self, tensor, dst=None):
        self._count("send")
        super().send(tensor, dst)

    def recv(self, size, dtype, src=None):
        self._count("recv")
        return super().recv(size, dtype, src)

    def destroy(self):
        totals = ", ".join(f"{op}={n}" for op, n in sorted(self.calls.items())) or "none"
        logger.warning("example_cpu communicator totals (group %s, rank %d of %d): %s", self.unique_name,
                       self.rank_in_group, self.world_size, totals)
        super().destroy()
