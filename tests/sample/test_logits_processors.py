"""Built-in and custom logits processors, through the batch and the sampler."""

import torch

from forkless import SamplingParams
from forkless.logits_processors import (
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from sample_helpers import VOCAB, fill, make_batch, step

FORCE = "sample_force_token:ForceTokenLogitsProcessor"


def test_builtins_declare_argmax_invariance():
    cpu = torch.device("cpu")
    assert MinPLogitsProcessor(None, cpu, False).is_argmax_invariant()
    assert not MinTokensLogitsProcessor(None, cpu, False).is_argmax_invariant()
    assert not LogitBiasLogitsProcessor(None, cpu, False).is_argmax_invariant()


def test_logit_bias_forces_a_token_only_in_its_row():
    logits = torch.randn(3, VOCAB)
    batch = fill([
        SamplingParams(temperature=0, logit_bias={7: 100.0}),
        SamplingParams(temperature=0),
        SamplingParams(seed=1, logit_bias={9: 100.0}),
    ])
    for _ in range(3):
        out = step(batch, logits).sampled_token_ids.tolist()
        assert out[0] == 7 and out[2] == 9
        assert out[1] == int(logits[1].argmax())


def test_negative_logit_bias_bans_the_argmax():
    logits = torch.randn(1, VOCAB)
    best = int(logits[0].argmax())
    batch = fill([SamplingParams(temperature=0, logit_bias={best: float("-inf")})])
    assert step(batch, logits).sampled_token_ids.item() != best


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    eos, stop = 2, 5
    logits = torch.zeros(2, VOCAB)
    logits[:, eos], logits[:, stop], logits[:, 11] = 10.0, 9.0, 1.0
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[stop])
    params.update_from_generation_config({}, model_eos_token_id=eos)
    batch = fill([params, SamplingParams(temperature=0)])
    picks = [step(batch, logits).sampled_token_ids.tolist() for _ in range(4)]
    assert [p[0] for p in picks] == [11, 11, 11, eos]
    assert [p[1] for p in picks] == [eos] * 4  # the other row is never masked


def test_min_tokens_counts_tokens_a_resumed_request_already_has():
    eos = 2
    logits = torch.zeros(1, VOCAB)
    logits[0, eos] = 10.0
    params = SamplingParams(temperature=0, min_tokens=3)
    params.update_from_generation_config({"eos_token_id": eos})
    batch = make_batch()
    batch.add_request("r", params, [1], output_token_ids=[4, 4])
    picks = [step(batch, logits).sampled_token_ids.item() for _ in range(2)]
    # Two tokens exist already, so only the first new one is held back from EOS.
    assert picks == [0, eos]
    assert batch.output_token_ids("r") == [4, 4, 0, eos]


def test_custom_processor_reads_extra_args():
    logits = torch.randn(3, VOCAB)
    batch = fill(
        [SamplingParams(extra_args={"force_token": 13}), SamplingParams(temperature=0),
         SamplingParams(temperature=0, extra_args={"force_token": 4})],
        custom=[FORCE],
    )
    for _ in range(3):
        out = step(batch, logits).sampled_token_ids.tolist()
        assert out == [13, int(logits[1].argmax()), 4]


def test_processor_state_follows_rows_through_remove_add_condense():
    """Each request keeps its own bias however its row moves."""
    biased = {f"r{i}": 10 + i for i in range(5)}
    batch = fill([SamplingParams(temperature=0, logit_bias={10 + i: 50.0}) for i in range(5)])
    logits = torch.zeros(5, VOCAB)
    step(batch, logits)
    batch.remove_request("r0")
    batch.remove_request("r2")
    assert batch.add_request("new", SamplingParams(temperature=0), [1]) == 0
    biased["new"] = None  # reuses r0's row, whose bias must not stick to it
    for _ in range(3):
        out = step(batch, torch.zeros(batch.num_reqs, VOCAB)).sampled_token_ids.tolist()
        got = dict(zip(batch.req_ids, out))
        assert {r: t for r, t in got.items() if biased[r] is not None} == {
            r: biased[r] for r in got if biased[r] is not None
        }
        assert got["new"] == 0  # unbiased zeros: argmax is token 0
    assert sorted(batch.req_ids) == ["new", "r1", "r3", "r4"]


def test_swapped_rows_keep_their_processor_state():
    batch = fill([SamplingParams(temperature=0, logit_bias={20: 50.0}),
                  SamplingParams(temperature=0, min_p=0.5, extra_args={"force_token": 6})],
                 custom=[FORCE])
    step(batch, torch.zeros(2, VOCAB))
    batch.swap_rows(0, 1)
    out = step(batch, torch.zeros(2, VOCAB)).sampled_token_ids.tolist()
    assert batch.req_ids == ["r1", "r0"] and out == [6, 20]
