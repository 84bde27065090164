"""vLLM's ``vllm.v1.metrics.stats``: here the very module :mod:`forkless.metrics.stats`
(``IterationStats``, ``FinishedRequestStats``, ``SchedulerStats``)."""

import sys

import forkless.metrics.stats

sys.modules[__name__] = forkless.metrics.stats
