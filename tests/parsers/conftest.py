"""Fixtures for parser tests: the real SmolLM2 tokenizer and a chat request with a tool."""

from __future__ import annotations

from pathlib import Path

import pytest

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
