"""The IO processor interface (vLLM's ``IOProcessor``; provisional tier)."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, AsyncIterator, Generic, Sequence, TypeVar

from forkless.plugins import Stability, stability
from forkless.pooling_params import PoolingParams

if TYPE_CHECKING:
    from forkless.outputs import PoolingRequestOutput

IOProcessorInput = TypeVar("IOProcessorInput")
IOProcessorOutput = TypeVar("IOProcessorOutput")


@stability(Stability.PROVISIONAL)
class IOProcessor(abc.ABC, Generic[IOProcessorInput, IOProcessorOutput]):
    """Turns a request's ``data`` into prompts, and the pooled outputs into a response.

    The server calls, per ``/pooling`` request with a ``data`` field:
    :meth:`parse_request` (the request body) -> :meth:`validate_or_generate_params` ->
    :meth:`pre_process_async` (prompts to pool) -> the engine pools each prompt ->
    :meth:`post_process_async` (the outputs, in prompt order) -> :meth:`output_to_response`.
    A ``ValueError`` from any of them is the client's 400.

    Args:
        config: The engine configuration (``forkless.config.EngineConfig``; vLLM names it
            ``vllm_config``).
    """

    def __init__(self, config: Any) -> None:
        self.config = config

    @abc.abstractmethod
    def parse_request(self, request: Any) -> IOProcessorInput:
        """The plugin's input from a request body (``request.data`` holds the client's data).

        Raises:
            ValueError: The data is not what the plugin takes (the client's 400).
        """

    @abc.abstractmethod
    def pre_process(self, prompt: IOProcessorInput, request_id: str | None = None,
                    **kwargs: Any) -> Any | Sequence[Any]:
        """The prompt(s) to pool: text, token ids, or prompt dicts (one, or a list)."""

    async def pre_process_async(self, prompt: IOProcessorInput, request_id: str | None = None,
                                **kwargs: Any) -> Any | Sequence[Any]:
        """:meth:`pre_process`, for the event loop (override when it awaits something)."""
        return self.pre_process(prompt, request_id, **kwargs)

    @abc.abstractmethod
    def post_process(self, model_output: Sequence[PoolingRequestOutput], request_id: str | None = None,
                     **kwargs: Any) -> IOProcessorOutput:
        """The plugin's output from the pooled outputs (in the order of the prompts)."""

    async def post_process_async(self, model_output: AsyncIterator[tuple[int, PoolingRequestOutput]],
                                 request_id: str | None = None, **kwargs: Any) -> IOProcessorOutput:
        """:meth:`post_process` over ``(prompt index, output)`` pairs as they finish."""
        collected = sorted([item async for item in model_output], key=lambda item: item[0])
        return self.post_process([out for _, out in collected], request_id, **kwargs)

    def validate_or_generate_params(self, params: PoolingParams | None = None) -> PoolingParams:
        """The pooling parameters of the request's prompts (default: the model's)."""
        return params or PoolingParams()

    @abc.abstractmethod
    def output_to_response(self, plugin_output: IOProcessorOutput) -> Any:
        """The response body's ``data`` (JSON-serialisable), from :meth:`post_process`'s output."""
