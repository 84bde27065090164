"""Two IO processors written for vLLM (``vllm`` renamed ``forkless`` in the imports): one on
vLLM's current interface (``parse_data``, ``merge_pooling_params``, ``post_process`` gives
the data), one on its earlier one (``parse_request``, ``validate_or_generate_params``,
``output_to_response`` making the whole ``IOProcessorResponse``). Both answer, per text,
its embedding's length and first value."""

from __future__ import annotations

from typing import Any, Sequence

from forkless.entrypoints.pooling.pooling.protocol import IOProcessorResponse
from forkless.plugins.io_processors.interface import IOProcessor
from forkless.pooling_params import PoolingParams


def current() -> str:
    return "vllm_style_io_processor:CurrentEcho"


def earlier() -> str:
    return "vllm_style_io_processor:EarlierEcho"


def unparsing() -> str:
    return "vllm_style_io_processor:Unparsing"


def _summaries(model_output: Sequence[Any]) -> list[dict]:
    return [{"dims": len(out.outputs.data), "first": float(out.outputs.data[0])} for out in model_output]


class CurrentEcho(IOProcessor):
    def __init__(self, vllm_config: Any, renderer: Any) -> None:
        super().__init__(vllm_config, renderer)
        self.max_model_len = self.vllm_config.model_config.max_model_len

    def parse_data(self, data: Any) -> list[str]:
        if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
            raise ValueError("data must be a list of texts")
        return data

    def merge_pooling_params(self, params: PoolingParams | None = None) -> PoolingParams:
        return PoolingParams(task="embed")

    def pre_process(self, prompt: list[str], request_id: str | None = None, **kwargs: Any) -> list[str]:
        return prompt

    def post_process(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> dict:
        return {"texts": _summaries(model_output), "style": "current"}


class EarlierEcho(IOProcessor):
    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)

    def parse_request(self, request: Any) -> list[str]:
        return list(request.data)

    def validate_or_generate_params(self, params: PoolingParams | None = None) -> PoolingParams:
        return PoolingParams(task="embed")

    def pre_process(self, prompt: list[str], request_id: str | None = None, **kwargs: Any) -> list[str]:
        return prompt

    def post_process(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> list:
        return _summaries(model_output)

    def output_to_response(self, plugin_output: list) -> IOProcessorResponse:
        return IOProcessorResponse(request_id="made-by-the-plugin", data={"texts": plugin_output, "style": "earlier"})


class Unparsing(CurrentEcho):
    """Neither parse_data nor parse_request: refused when the server starts."""

    parse_data = IOProcessor.parse_data
