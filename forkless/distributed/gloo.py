"""The CPU platform's communicator: ``torch.distributed`` over gloo.

Invariant: the collectives run on the gloo group the parallel state made for the
platform's ``dist_backend`` (gloo on the CPU), never on another backend.
"""

from __future__ import annotations

from forkless.distributed.interface import DeviceCommunicatorBase


class GlooCommunicator(DeviceCommunicatorBase):
    """Collectives between CPU workers through gloo (TCP on one host or across hosts).

    The base class's ``torch.distributed`` calls are gloo's; gloo has no
    ``reduce_scatter``, which the base class builds from an all-reduce.
    """
