"""A platform that runs on the CPU under its own name."""

from forkless.platforms.cpu import CpuPlatform


class ExampleCpuPlatform(CpuPlatform):
    name = "example_cpu"
    device_name = "example CPU device"
