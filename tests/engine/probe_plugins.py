"""Plugins for fault tests: ones that break their contract (the engine must name them),
and one that slows every step (a request stays in flight for seconds).

Selected by path: ``tests.engine.probe_plugins:Class`` in process, or
``probe_plugins:Class`` with this folder on ``PYTHONPATH`` (a server's workers). They
import nothing from the tests, so a worker process can load them alone.
"""

from __future__ import annotations

import time
from typing import Any

from forkless.logits_processors import LogitsProcessor
from forkless.spec_decode import ProposalBatch, Proposer


class _Processor(LogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        pass


class ReturnsNone(_Processor):
    """Changes the logits in place and forgets to return them."""

    def apply(self, logits: Any) -> Any:
        logits[:, 0] = 0.0


class ReturnsTenColumns(_Processor):
    """Returns only the first ten token ids' logits."""

    def apply(self, logits: Any) -> Any:
        return logits[:, :10]


class SlowSteps(_Processor):
    """Leaves the logits alone, 20 ms a step."""

    def apply(self, logits: Any) -> Any:
        time.sleep(0.02)
        return logits


class RaisingProposer(Proposer):
    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        raise RuntimeError("probe: proposer failed")


class StringDrafts(Proposer):
    """One draft per request, a string instead of token ids."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return ["abc"] * len(batch.request_ids)  # type: ignore[list-item]


class OutOfVocabDrafts(Proposer):
    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return [[10**9] for _ in batch.request_ids]


class TooFewDrafts(Proposer):
    """Forgets every request but the first."""

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        return [[1]]
