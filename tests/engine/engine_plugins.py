"""Custom classes selected by path in the engine tests (``--scheduler-cls``; the custom
logits processor is tests/sample/sample_force_token.py)."""

from __future__ import annotations

from forkless.core.sched import Scheduler


class CountingScheduler(Scheduler):
    """The default scheduler, counting its steps (proves the class was used)."""

    steps = 0

    def schedule(self):  # type: ignore[no-untyped-def]
        type(self).steps += 1
        return super().schedule()
