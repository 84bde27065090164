"""Shared test helpers: a batch with the built-in processors, and one sampling step."""

from __future__ import annotations

import torch

from forkless import SamplingParams
from forkless.logits_processors import build_logits_processors
from forkless.sample import InputBatch, Sampler, SamplerOutput

VOCAB = 32


def make_batch(custom=None, vocab: int = VOCAB, device: str = "cpu") -> InputBatch:
    procs = build_logits_processors(None, torch.device(device), False, custom, entry_points=False)
    return InputBatch(max_num_reqs=1024, vocab_size=vocab, device=device, logits_processors=procs)


def step(batch: InputBatch, logits: torch.Tensor, sampler: Sampler | None = None) -> SamplerOutput:
    """refresh -> sample -> append, like the model runner does."""
    metadata = batch.refresh()
    out = (sampler or Sampler())(logits.clone(), metadata)
    batch.append_output_tokens(out.sampled_token_ids.tolist())
    return out


def fill(
    params: list[SamplingParams], custom=None, vocab: int = VOCAB, device: str = "cpu"
) -> InputBatch:
    batch = make_batch(custom, vocab, device)
    for i, p in enumerate(params):
        batch.add_request(f"r{i}", p, [1, 2, 3])
    return batch
