"""What KV connectors report from the workers to the scheduler, as plain data.

Invariants:
    * The scheduler side's per-step metadata crosses to the workers as msgpack bytes
      (``SchedulerOutput.kv_connector_metadata``), encoded and decoded by
      ``forkless.kv_transfer`` against the connector's declared metadata type; this
      module only carries the way back, which has one fixed shape for every connector.
    * Counts here are per step (not cumulative): the engine core adds them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec


@dataclass
class KVTransferStats:
    """Bytes and seconds a connector spent moving KV (vLLM's ``KVConnectorStats``).

    Attributes:
        load_bytes: KV bytes written into the cache from the connector's store.
        load_seconds: Time spent loading them (fetch + copy; overlapping loads add up).
        save_bytes: KV bytes written to the store.
        save_seconds: Time spent saving them.
        external_prefix_cache_queries: Prompt tokens the scheduler asked the connector
            about (each admission's tokens not found in the local prefix cache).
        external_prefix_cache_hits: Of those, tokens the connector had.
    """

    load_bytes: int = 0
    load_seconds: float = 0.0
    save_bytes: int = 0
    save_seconds: float = 0.0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0

    def add(self, other: KVTransferStats) -> None:
        """Add another step's (or worker's) counts to these."""
        self.load_bytes += other.load_bytes
        self.load_seconds += other.load_seconds
        self.save_bytes += other.save_bytes
        self.save_seconds += other.save_seconds
        self.external_prefix_cache_queries += other.external_prefix_cache_queries
        self.external_prefix_cache_hits += other.external_prefix_cache_hits


@dataclass
class KVConnectorOutput:
    """One step's news from a worker's connector (vLLM's ``KVConnectorOutput``).

    Attributes:
        finished_sending: Requests whose asynchronous saves ended: the scheduler may now
            free the blocks it kept for them (``request_finished`` returned True).
        finished_recving: Requests whose asynchronous loads ended (failed blocks, if any,
            are in ``invalid_block_ids`` of this step or an earlier one): they may run.
        invalid_block_ids: Blocks whose load failed; the requests holding them compute
            those positions (and every later one) instead.
        stats: What this step's transfers moved.
    """

    finished_sending: list[str] = field(default_factory=list)
    finished_recving: list[str] = field(default_factory=list)
    invalid_block_ids: list[int] = field(default_factory=list)
    stats: KVTransferStats | None = None

    @property
    def is_empty(self) -> bool:
        """Nothing to report."""
        return not (self.finished_sending or self.finished_recving or self.invalid_block_ids or self.stats)


class KVOutputAggregator:
    """Merges the ranks' :class:`KVConnectorOutput` of each step into one (vLLM's
    ``KVOutputAggregator``): under ``-tp`` every rank moves its own heads of a block, so a
    request's asynchronous save or load has ended only once every rank has reported it
    (in this step or an earlier one); a block that failed on any rank failed; the ranks'
    bytes and seconds add up.

    Args:
        world_size: Ranks that report.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        # Ranks still to report, per request (counted from the first report).
        self._sending: dict[str, int] = {}
        self._recving: dict[str, int] = {}

    def _count(self, remaining: dict[str, int], reports: list[list[str]]) -> list[str]:
        done = []
        for report in reports:
            for rid in report:
                left = remaining.get(rid, self.world_size) - 1
                if left:
                    remaining[rid] = left
                else:
                    remaining.pop(rid, None)
                    done.append(rid)
        return done

    def aggregate(self, outputs: list[KVConnectorOutput | None]) -> KVConnectorOutput | None:
        """One step's merged output (``None`` when no rank reported anything)."""
        present = [o for o in outputs if o is not None]
        if not present:
            return None
        merged = KVConnectorOutput(
            finished_sending=self._count(self._sending, [o.finished_sending for o in present]),
            finished_recving=self._count(self._recving, [o.finished_recving for o in present]),
            invalid_block_ids=sorted({b for o in present for b in o.invalid_block_ids}),
        )
        for o in present:
            if o.stats is not None:
                if merged.stats is None:
                    merged.stats = KVTransferStats()
                merged.stats.add(o.stats)
        return merged


def encode_connector_metadata(metadata: Any) -> bytes:
    """A connector's step metadata (a dataclass or ``msgspec.Struct``) as msgpack."""
    return msgspec.msgpack.encode(metadata)


def decode_connector_metadata(data: bytes, metadata_cls: type) -> Any:
    """Step metadata decoded into the connector's ``metadata_cls``.

    Raises:
        msgspec.ValidationError: It does not match the type.
    """
    return msgspec.msgpack.decode(data, type=metadata_cls)


class BlockIds(list):
    """A request's block ids as :meth:`KVConnectorBase.update_state_after_alloc` gets them:
    a list of ints, which also answers vLLM's ``KVCacheBlocks`` calls (one KV-cache group)."""

    def get_block_ids(self) -> tuple[list[int]]:
        """vLLM's form: one list of block ids per KV-cache group (here one)."""
        return (list(self),)

    def get_unhashed_block_ids(self) -> list[int]:
        """vLLM's name for the ids (every block of the one group)."""
        return list(self)
