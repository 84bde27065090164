"""The offline throughput workload: forkless ``LLM.generate`` against transformers ``generate``.

N prompts of random token ids with random input and output lengths drawn from one seeded
generator, each run to exactly its output length (``ignore_eos``). The baseline runs the
same requests through Hugging Face ``generate`` in padded static batches (left padding,
in request order), each batch running to its longest request; only each request's own
output length counts as useful tokens, for both.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

Workload = list[tuple[list[int], int]]


def make_workload(n: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int,
                  seed: int) -> Workload:
    """``n`` (prompt token ids, output length) pairs; ids avoid the special tokens at the start.

    Args:
        n: Number of requests.
        input_len: Inclusive (min, max) prompt length.
        output_len: Inclusive (min, max) output length.
        vocab: Vocabulary size (ids are drawn from ``[100, vocab)``).
        seed: Seeds the generator; the same arguments give the same workload.
    """
    rng = random.Random(seed)
    work = []
    for _ in range(n):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(*input_len))]
        work.append((prompt, rng.randint(*output_len)))
    return work


@dataclass
class Result:
    """Wall time and useful output tokens of one system on (part of) the workload."""

    seconds: float
    tokens: int
    requests: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def run_forkless(model: str, work: Workload, **engine_args: Any) -> Result:
    """All requests through one ``LLM.generate`` call (after a short warm-up)."""
    from forkless.entrypoints.llm import LLM
    from forkless.sampling_params import SamplingParams

    engine_args.setdefault("max_model_len", max(len(p) + o for p, o in work) + 16)
    llm = LLM(model, **engine_args)
    try:
        prompts = [{"prompt_token_ids": p} for p, _ in work]
        llm.generate(prompts[:2], [SamplingParams(max_tokens=4, ignore_eos=True)] * 2, use_tqdm=False)
        # Token ids only (as the baseline): skipping detokenization is what vLLM's
        # benchmarks do too.
        params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True, detokenize=False)
                  for _, o in work]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
    finally:
        llm.shutdown()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    if tokens != sum(o for _, o in work):
        raise RuntimeError("forkless did not produce every requested token")
    return Result(elapsed, tokens, len(work))


def run_transformers(model: str, work: Workload, batch_size: int, dtype: str = "float32",
                     device: str = "cpu", max_batches: int | None = None,
                     load_format: str = "auto") -> Result:
    """Padded static batches through HF ``generate``.

    Args:
        model: The model folder.
        work: The workload (the first ``max_batches * batch_size`` requests run).
        batch_size: Requests per static batch.
        dtype: Model dtype name.
        device: Where the model runs.
        max_batches: Run only this many batches (``None``: all); the rate of a prefix of
            the request stream is what a ratio needs when the whole would take too long.
        load_format: ``"dummy"`` builds the model from its config with random weights.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    if load_format == "dummy":
        with torch.device(device):
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=torch_dtype)
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to(device)
    hf.eval()
    eos = hf.config.eos_token_id
    pad = eos if isinstance(eos, int) else 0

    def batch(items: Workload) -> None:
        width = max(len(p) for p, _ in items)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in items], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in items], device=device)
        new = max(o for _, o in items)
        # min_new_tokens = max_new_tokens: EOS is suppressed, as with ignore_eos.
        hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=pad)

    if max_batches is not None:
        work = work[: max_batches * batch_size]
    with torch.inference_mode():
        batch([(work[0][0], 4), (work[1 % len(work)][0], 4)])  # warm-up
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(0, len(work), batch_size):
            batch(work[i : i + batch_size])
        if device != "cpu":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    del hf
    return Result(elapsed, sum(o for _, o in work), len(work))
