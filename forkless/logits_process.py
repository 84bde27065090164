"""vLLM's ``vllm.logits_process`` path: the type of a per-request logits processor.

``LogitsProcessor`` here is that function type (``(output_ids, logits_row) -> row`` or
``(prompt_ids, output_ids, logits_row) -> row``), not the batch-level class of
:mod:`forkless.logits_processors`; :class:`~forkless.logits_processors.AdapterLogitsProcessor`
runs such functions.
"""

from forkless.logits_processors.adapter import RequestLogitsProcessor

LogitsProcessor = RequestLogitsProcessor

__all__ = ["LogitsProcessor", "RequestLogitsProcessor"]
