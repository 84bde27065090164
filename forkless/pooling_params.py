"""Per-request pooling parameters (vLLM's ``PoolingParams``), and the pooled data on the wire.

Invariants:
    * ``PoolingParams`` is a ``msgspec.Struct``: it crosses the API server -> engine core ->
      worker sockets as msgpack, like ``SamplingParams``, and ``__post_init__`` rejects a
      bad value on either side with the same message.
    * A request with ``PoolingParams`` is a pooling request: the scheduler runs its whole
      prompt in one step and finishes it there; it never samples a token.
    * Pooled values cross every process boundary as :class:`PooledData`: float32
      little-endian bytes and a shape, never a pickled tensor.
"""

from __future__ import annotations

from typing import Any

import msgspec

#: vLLM's pooling tasks. ``embed``: one normalised vector per prompt; ``classify``: class
#: probabilities from the model's classifier head; ``score``: a cross-encoder's relevance
#: (one label, sigmoid); ``token_embed`` / ``encode``: one vector per prompt token.
POOLING_TASKS = ("embed", "classify", "score", "token_embed", "token_classify", "encode")


class PoolingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pool one request's hidden states (vLLM's names).

    Attributes:
        task: One of :data:`POOLING_TASKS`; ``None`` takes the engine's default
            (``embed`` for an embedding model, ``classify`` for a classifier).
        dimensions: Keep the first this many dimensions of an embedding and renormalise
            (Matryoshka models only: the engine checks the model allows it).
        normalize: L2-normalise embeddings (``None``: the model's default, on).
        use_activation: Apply the classifier's activation (softmax for several labels,
            sigmoid for one) (``None``: on).
        token_type_ids: Segment ids of the prompt's tokens (a cross-encoder's query and
            document pair), as long as the prompt; ``None``: all 0. Filled by the server
            and ``LLM.score``, not by users.
    """

    task: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    token_type_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if self.task == "plugin":
            raise ValueError("pooling task 'plugin' (vLLM's raw hidden states for an IO processor) is not one "
                             f"forkless's poolers have: leave task unset for the model's own, or one of "
                             f"{', '.join(POOLING_TASKS)}")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"pooling task {self.task!r} is not one of {', '.join(POOLING_TASKS)}")
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")

    def clone(self) -> PoolingParams:
        """A copy (the token-type list included)."""
        return msgspec.structs.replace(
            self, token_type_ids=None if self.token_type_ids is None else list(self.token_type_ids))


class PooledData(msgspec.Struct, array_like=True, gc=False):
    """A pooled tensor as plain data: float32 little-endian bytes in row-major order.

    Attributes:
        shape: ``[dim]`` for one vector per prompt, ``[tokens, dim]`` for one per token.
        data: ``prod(shape)`` float32 values.
    """

    shape: list[int]
    data: bytes

    def to_numpy(self) -> Any:
        """The values as a float32 numpy array of :attr:`shape`."""
        import numpy as np

        return np.frombuffer(self.data, dtype="<f4").reshape(self.shape)

    @classmethod
    def from_numpy(cls, array: Any) -> PooledData:
        """Wrap a numpy array (converted to float32)."""
        import numpy as np

        a = np.ascontiguousarray(array, dtype="<f4")
        return cls(list(a.shape), a.tobytes())
