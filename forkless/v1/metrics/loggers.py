"""vLLM's ``vllm.v1.metrics.loggers``: here the very package :mod:`forkless.metrics`
(``StatLoggerBase``, ``LoggingStatLogger``, ``load_stat_logger_plugin_factories``)."""

import sys

import forkless.metrics

sys.modules[__name__] = forkless.metrics
