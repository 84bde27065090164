"""Benchmarks shared by ``forkless bench`` and ``benchmarks/*.py`` (imported on demand)."""
