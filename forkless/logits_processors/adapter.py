"""Per-request logits processors under the batch-level interface (vLLM's adapter).

vLLM's older API took per-request functions, ``fn(output_ids, logits_row)`` or
``fn(prompt_ids, output_ids, logits_row)``, each returning the row. Its v1 engine keeps
them only through :class:`AdapterLogitsProcessor`: a batch-level processor whose
subclass says, per request, which function (if any) applies, and which then calls each
row's function on that row. vLLM's module ``vllm.logits_process`` (the function type,
``RequestLogitsProcessor`` here) is this module under its renamed path.

Invariants:
    * A row's function gets the request's live output list (the batch appends each new
      token to it), so it always sees every token generated so far.
    * Rows whose request has no function are not touched; a function that returns a new
      tensor has it copied into its row, one that edits its row in place costs nothing more.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Union

from forkless.logits_processors.interface import BatchUpdate, LogitsProcessor
from forkless.logits_processors.state import process_dict_updates

if TYPE_CHECKING:
    import torch

    from forkless.sampling_params import SamplingParams

#: A per-request logits processor: ``(output_ids, logits_row) -> logits_row`` or
#: ``(prompt_ids, output_ids, logits_row) -> logits_row`` (vLLM's ``LogitsProcessor``
#: of ``vllm.logits_process``).
RequestLogitsProcessor = Union[
    Callable[[list[int], "torch.Tensor"], "torch.Tensor"],
    Callable[[list[int], list[int], "torch.Tensor"], "torch.Tensor"],
]


class AdapterLogitsProcessor(LogitsProcessor):
    """Runs per-request logits processors, one function per request that wants one.

    Subclass it, implement :meth:`new_req_logits_processor` (the function for a request,
    from its parameters, or ``None``) and :meth:`is_argmax_invariant`; a subclass
    ``__init__`` must call ``super().__init__(config, device, is_pin_memory)``.

    Args:
        config: The engine configuration (read-only).
        device: Where the logits live.
        is_pin_memory: Whether pinned host memory may be used.
    """

    def __init__(self, config: Any, device: "torch.device", is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        # row -> its function with the token lists bound, so only the row is left to pass.
        self.req_info: dict[int, Callable[["torch.Tensor"], "torch.Tensor"]] = {}

    @abstractmethod
    def new_req_logits_processor(self, params: "SamplingParams") -> RequestLogitsProcessor | None:
        """The function to run on a new request's row, or ``None`` to leave it alone.

        Args:
            params: The request's sampling parameters (its own arguments in ``extra_args``).
        """

    def _new_state(self, params: "SamplingParams", prompt_ids: list[int] | None,
                   output_ids: list[int]) -> Callable[["torch.Tensor"], "torch.Tensor"] | None:
        fn = self.new_req_logits_processor(params)
        if fn is None:
            return None
        # Three parameters: the prompt comes first (vLLM tells the two forms apart so too).
        if len(inspect.signature(fn).parameters) == 3:
            return partial(fn, list(prompt_ids or ()), output_ids)
        return partial(fn, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.req_info, batch_update, self._new_state)

    def is_active(self) -> bool:
        return bool(self.req_info)

    def apply(self, logits: "torch.Tensor") -> "torch.Tensor":
        for index, fn in self.req_info.items():
            row = logits[index]
            new_row = fn(row)
            if new_row is not row:
                logits[index] = new_row
        return logits
