"""The same sampling guarantees with the batch and logits on a CUDA device."""

import pytest
import torch

from forkless import SamplingParams
from sample_helpers import VOCAB, fill, step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FORCE = "sample_force_token:ForceTokenLogitsProcessor"


def _seeded_tokens(neighbours: int) -> list[int]:
    params = [SamplingParams(temperature=0.8, top_k=5) for _ in range(neighbours)]
    params.append(SamplingParams(seed=11, top_p=0.9, min_p=0.01, repetition_penalty=1.2))
    batch = fill(params, device="cuda")
    target = f"r{neighbours}"
    for t in range(6):
        logits = torch.randn(len(params), VOCAB, device="cuda")
        logits[batch.req_id_to_index[target]] = torch.randn(
            VOCAB, generator=torch.Generator().manual_seed(t)
        ).cuda()
        step(batch, logits)
    return list(batch.output_token_ids(target))


def test_seeded_rows_are_independent_of_the_batch_on_cuda():
    assert _seeded_tokens(0) == _seeded_tokens(3) == _seeded_tokens(9)


def test_processors_and_logprobs_on_cuda():
    eos = 2
    logits = torch.zeros(3, VOCAB, device="cuda")
    logits[:, eos] = 10.0
    first = SamplingParams(temperature=0, min_tokens=2, logprobs=2)
    first.update_from_generation_config({}, model_eos_token_id=eos)
    batch = fill(
        [first, SamplingParams(temperature=0, logit_bias={7: 50.0}),
         SamplingParams(extra_args={"force_token": 5}, frequency_penalty=0.5)],
        custom=[FORCE], device="cuda",
    )
    out = step(batch, logits)
    assert out.sampled_token_ids.device.type == "cuda"
    assert out.sampled_token_ids.tolist()[1:] == [7, 5]
    assert out.sampled_token_ids[0].item() != eos
    assert out.logprobs.ranks[1].item() == 2  # raw: token 7 is second to EOS


def test_few_rows_argmax_on_cuda_equals_torch():
    # row_argmax sends up to FEW_ROWS rows of a vocabulary's width to the Triton argmax.
    from argmax_cases import cases

    from forkless.sample.argmax import FEW_ROWS, row_argmax

    for x in cases("cuda"):
        for rows in (1, 2, FEW_ROWS, FEW_ROWS + 1):
            assert row_argmax(x[:rows]).tolist() == x[:rows].argmax(dim=-1).tolist(), (x.dtype, x.shape, rows)
