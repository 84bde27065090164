"""vLLM's ``vllm.v1`` package path, for plugins ported from vLLM by renaming imports.

The modules beneath it (``forkless.v1.sample.logits_processor``, ``forkless.v1.metrics.loggers``,
``forkless.v1.metrics.stats``) are forkless's own, under the alias finder of
:mod:`forkless.module_aliases`; forkless's own code never imports them.
"""
