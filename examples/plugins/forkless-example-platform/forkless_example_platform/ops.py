"""The example platform's own SiLU-and-mul, replacing forkless's ``silu_and_mul`` custom op.

A real platform would call its device's kernel in ``forward_oot``; this one computes the
op in plain PyTorch, counts its calls and logs the first, so a test can see that the
platform's op, not forkless's, ran. ``ExampleCpuPlatform.pre_register_and_update``
registers it by path, so only the processes that build a model import it.
"""

import logging

from forkless.ops.activation import SiluAndMul

logger = logging.getLogger("forkless.example_platform")


class ExampleSiluAndMul(SiluAndMul):
    #: forward_oot calls in this process, over all layers.
    calls = 0

    def forward_oot(self, x):
        cls = type(self)
        if cls.calls == 0:
            logger.warning("example_cpu silu_and_mul: first call")
        cls.calls += 1
        return self.forward_native(x)
