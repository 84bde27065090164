"""Platform detectors: return the Platform class path when the device is present, else None.

A real plugin would probe its hardware here (cheaply: no heavy imports). This example's
"device" is present when FORKLESS_EXAMPLE_PLATFORM=1; the twin exists to show what
forkless does when two out-of-tree platforms activate at once (it refuses to guess).
"""

import os


def detect() -> str | None:
    if os.environ.get("FORKLESS_EXAMPLE_PLATFORM") == "1":
        return "forkless_example_platform.platform:ExampleCpuPlatform"
    return None


def detect_twin() -> str | None:
    if os.environ.get("FORKLESS_EXAMPLE_PLATFORM_TWIN") == "1":
        return "forkless_example_platform.platform:ExampleCpuPlatform"
    return None
