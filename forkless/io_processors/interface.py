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

    The server calls, per ``/pooling`` request with a ``data`` field (vLLM's current names):
    :meth:`parse_data` (the client's ``data``) -> :meth:`merge_pooling_params` ->
    :meth:`pre_process_async` (prompts to pool) -> the engine pools each prompt ->
    :meth:`post_process_async` (the outputs, in prompt order), whose result is the
    response's ``data``. A ``ValueError`` from any of them is the client's 400. vLLM's
    earlier names still work where a plugin defines them instead: ``parse_request``
    (gets the whole request), ``validate_or_generate_params`` and ``output_to_response``
    (its result is the response's ``data``, or the whole response when it is an
    ``IOProcessorResponse``).

    Args:
        config: The engine configuration (``forkless.config.EngineConfig``); vLLM's
            keyword ``vllm_config`` names it too, and ``self.vllm_config`` is it.
        renderer: vLLM's prompt renderer argument, accepted and kept (forkless passes
            ``None``; the engine tokenizes text prompts).
    """

    def __init__(self, config: Any = None, renderer: Any = None, *, vllm_config: Any = None) -> None:
        self.config = config if config is not None else vllm_config
        self.vllm_config = self.config
        self.renderer = renderer

    def parse_data(self, data: Any) -> IOProcessorInput:
        """The plugin's input from the request's ``data``.

        Raises:
            ValueError: The data is not what the plugin takes (the client's 400).
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither parse_data(data) nor vLLM's "
                                  "earlier parse_request(request)")

    def merge_pooling_params(self, params: PoolingParams | None = None) -> PoolingParams:
        """The pooling parameters of the request's prompts (default: the model's; vLLM's
        default is its ``"plugin"`` task, raw hidden states, which forkless's poolers do
        not have)."""
        return params or PoolingParams()

    def merge_sampling_params(self, params: Any = None) -> Any:
        """vLLM's hook for IO processors of generative models: the sampling parameters of the
        request's prompts. forkless runs IO processors for ``/pooling`` only and never calls
        it; it is here so that a ported processor's ``super()`` call resolves."""
        from forkless.sampling_params import SamplingParams

        return params or SamplingParams()

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

    # -- the server's entry points: vLLM's current names, else its earlier ones ------------
    def parse_body(self, request: Any) -> IOProcessorInput:
        """The plugin's input from a ``/pooling`` request: :meth:`parse_data` of its ``data``,
        or an earlier plugin's ``parse_request`` of the whole request."""
        if type(self).parse_data is IOProcessor.parse_data and callable(getattr(self, "parse_request", None)):
            return self.parse_request(request)  # type: ignore[attr-defined]
        return self.parse_data(request.data)

    def pooling_params(self) -> PoolingParams:
        """:meth:`merge_pooling_params`, or an earlier plugin's ``validate_or_generate_params``."""
        earlier = getattr(self, "validate_or_generate_params", None)
        if type(self).merge_pooling_params is IOProcessor.merge_pooling_params and callable(earlier):
            return earlier(None)
        return self.merge_pooling_params(None)

    def response_data(self, plugin_output: IOProcessorOutput) -> Any:
        """The response's ``data`` (or a whole ``IOProcessorResponse``): an earlier plugin's
        ``output_to_response``, else :meth:`post_process`'s result itself."""
        earlier = getattr(self, "output_to_response", None)
        return earlier(plugin_output) if callable(earlier) else plugin_output
