"""A logits processor plugin: a ``LogitsProcessor`` subclass, run in the workers.

It acts only on requests that ask for it, through ``SamplingParams.extra_args``
(``"vllm_xargs": {"force_token_id": N}`` in an HTTP request): every token they generate
is ``N``. Other requests in the same batch are untouched. The API server imports this
module to validate requests, so it does not import torch.
"""

from forkless.logits_processors import BatchUpdate, LogitsProcessor, process_dict_updates

ARG = "force_token_id"


class ForceTokenLogitsProcessor(LogitsProcessor):
    def __init__(self, config, device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self.rows: dict[int, int] = {}  # batch row -> forced token id

    @classmethod
    def validate_params(cls, params) -> None:
        token = (params.extra_args or {}).get(ARG)
        if token is not None and (isinstance(token, bool) or not isinstance(token, int) or token < 0):
            raise ValueError(f"extra_args.{ARG}={token!r} is invalid: expected a token id >= 0")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the argmax: greedy rows need it too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update,
                             lambda params, _prompt, _output: (params.extra_args or {}).get(ARG))

    def apply(self, logits):
        for row, token in self.rows.items():
            if token < logits.shape[1]:
                keep = logits[row, token].clone()
                logits[row] = float("-inf")
                logits[row, token] = keep
        return logits
