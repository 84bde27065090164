"""vLLM's older ``vllm.entrypoints.openai.tool_parsers`` path: here the very package :mod:`forkless.tool_parsers`.

``from forkless.entrypoints.openai.tool_parsers import ToolParser, ToolParserManager`` and
``...tool_parsers.abstract_tool_parser`` give forkless's classes.
"""

import sys

import forkless.tool_parsers

sys.modules[__name__] = forkless.tool_parsers
