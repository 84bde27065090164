"""The Triton LoRA kernels on the CPU, under Triton's interpreter (``TRITON_INTERPRET=1``).

CI has no GPU, so ``tests/gpu/test_lora_triton.py`` is skipped there; its kernel checks
(float32: the interpreter's bfloat16 ``tl.dot`` is not exact) run here in a child process,
where the variable is set before Triton is imported: the folded path (steps of at most
``FOLD_MAX_TOKENS`` tokens; at rank 64 the slots span several chunks, some skipped), the
segment path (larger steps), a base-only step after an
adapter step, and the folded layer's weight views.
"""

from __future__ import annotations

from tests.triton_interpreter import needs_triton, run_interpreted

_SCRIPT = """
import torch
import tests.gpu.test_lora_triton as t
for shape in [(256, [128, 64, 64], 16), (96, [80, 48, 40], 8), (192, [64], 32), (128, [64, 64], 64)]:
    for n in [1, 7, 40, 300]:
        t.test_kernels_match_torch_eager(torch.float32, 1e-4, n, shape)
t.test_kernels_no_adapter_token_is_base()
t.test_folded_layer_shares_the_base_weight()
print("kernels ok")
"""


@needs_triton
def test_kernels_under_the_interpreter() -> None:
    run_interpreted(_SCRIPT, "kernels ok")
