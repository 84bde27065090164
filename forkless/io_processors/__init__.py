"""IO processor plugins (provisional): turn a ``/pooling`` request's ``data`` into prompts and
the pooled outputs into a response (vLLM's interface).

Invariants:
    * Plugins come from the ``forkless.io_processor_plugins`` entry-point group: each entry
      point is a zero-argument callable returning an :class:`IOProcessor` class path, or
      ``None`` when it does not apply. ``--io-processor-plugin NAME`` selects one by its
      entry-point name; without the flag none is loaded.
    * They run in the API server only (torch-free there): they see prompts and
      ``PoolingRequestOutput`` s, never the model.
"""

from forkless.io_processors.interface import IOProcessor
from forkless.io_processors.registry import get_io_processor

__all__ = ["IOProcessor", "get_io_processor"]
