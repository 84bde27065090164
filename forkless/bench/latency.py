"""Batch-1 decode latency against the memory-bandwidth bound.

A batch-1 decode step must read every weight once, so ``weight bytes / copy bandwidth``
is its floor; the bandwidth is measured in the same run with a large device-to-device
copy (bytes read + bytes written).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


def copy_bandwidth(device: str = "cuda", nbytes: int | None = None, repeats: int | None = None) -> float:
    """Median bytes/s of a device-to-device copy, counting bytes read plus written.

    On CUDA: a 4 GiB copy timed with CUDA events, 20 times after 3 warm-ups. On the CPU:
    a 256 MiB host memory copy (past the caches) timed with ``perf_counter``, 5 times
    after 1 warm-up (``torch``'s copy uses the intra-op threads).
    """
    import torch

    cuda = device != "cpu"
    nbytes = nbytes or ((4 << 30) if cuda else (256 << 20))
    repeats = repeats or (20 if cuda else 5)
    warm = 3 if cuda else 1
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + warm):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    times = sorted(times[warm:])
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    return 2 * nbytes / times[len(times) // 2]


@dataclass
class LatencyResult:
    """Per-output-token decode time of a batch-1 request."""

    ms_per_token: float
    prompt_len: int
    output_len: int


def run_latency(model: str, prompt_len: int = 128, output_len: int = 256, repeats: int = 3,
                **engine_args: Any) -> LatencyResult:
    """Median time per output token after the first, over ``repeats`` runs.

    The first token (prefill) is timed separately with a 1-token run and subtracted.
    """
    from forkless.entrypoints.llm import LLM
    from forkless.sampling_params import SamplingParams

    llm = LLM(model, max_num_seqs=1, **engine_args)
    try:
        prompt = [{"prompt_token_ids": [100 + i for i in range(prompt_len)]}]

        def timed(n: int) -> float:
            t0 = time.perf_counter()
            # Token ids only: text is not part of what the benchmark times.
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
            out = llm.generate(prompt, params, use_tqdm=False)
            assert len(out[0].outputs[0].token_ids) == n
            return time.perf_counter() - t0

        timed(8)  # warm-up
        first = sorted(timed(1) for _ in range(repeats))[repeats // 2]
        full = sorted(timed(output_len) for _ in range(repeats))[repeats // 2]
    finally:
        llm.shutdown()
    return LatencyResult((full - first) / (output_len - 1) * 1e3, prompt_len, output_len)
