"""vLLM's ``vllm.v1`` import paths, for plugins ported from vLLM by renaming imports.

Invariants:
    * Each module here *is* a forkless module (an alias in ``sys.modules``), never a copy:
      a class imported through a vLLM path is the same class forkless checks against.
    * Only paths a plugin author imports are here; forkless's own code never imports them.
"""
