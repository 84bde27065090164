"""The platform plugin's detector, as vLLM's dummy platform plugin writes it.

It returns the platform's class path (dotted, as vLLM spells it). ``VLLM_STYLE_PLATFORM``
picks which of the two sample platforms: ``cpu`` (the default) or ``dummy``.
"""

import os

PLATFORMS = {
    "cpu": "vllm_style_platform.platform.VllmStyleCpuPlatform",
    "dummy": "vllm_style_platform.platform.DummyStylePlatform",
}


def vllm_style_platform_plugin() -> str | None:
    return PLATFORMS.get(os.environ.get("VLLM_STYLE_PLATFORM", "cpu"))
