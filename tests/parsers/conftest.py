"""Fixtures for parser tests: the real SmolLM2 tokenizer, a chat request with a tool, and
the deprecation warnings a test causes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from forkless.plugins import DEPRECATIONS
from forkless.protocol.openai import ChatCompletionRequest

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="session")
def tokenizer(smollm2_folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder)


@pytest.fixture
def request_with_tools() -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL])


class DeprecationLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def deprecations():
    """The deprecation warnings logged during the test, each one fresh (warned-once reset)."""
    handler = DeprecationLog()
    logger = logging.getLogger("forkless.deprecation")
    warned = set(DEPRECATIONS._warned)
    DEPRECATIONS._warned.clear()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)
    DEPRECATIONS._warned.clear()
    DEPRECATIONS._warned.update(warned)
