"""Sampler behaviour a user notices: greedy, seeds, top-k/top-p/min-p, penalties, logprobs."""

import math

import torch

from forkless import SamplingParams
from forkless.sample import Sampler
from forkless.sample.penalties import apply_penalties
from sample_helpers import VOCAB, fill, step


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(5)
    batch = fill([SamplingParams(temperature=0.0) for _ in range(5)])
    out = step(batch, logits)
    assert out.sampled_token_ids.tolist() == logits.argmax(-1).tolist()
    assert out.logprobs is None


def test_bfloat16_logits_sample_as_their_float32_copy():
    """Models hand the sampler logits in their own dtype: a greedy batch takes the argmax
    there (ties: the lowest id, as in float32), the others compute in float32."""
    logits = _logits(6, seed=5).bfloat16()
    logits[2, 7] = logits[2, 11] = logits[2].max() + 1  # a tie: token 7 wins
    batch = fill([SamplingParams(temperature=0.0) for _ in range(6)])
    assert not Sampler.needs_float32(batch.refresh())  # the built-in processors are idle
    greedy = step(batch, logits.clone())
    assert greedy.sampled_token_ids.tolist() == logits.float().argmax(-1).tolist()
    assert greedy.sampled_token_ids[2] == 7
    # Penalties and logprobs need float32 arithmetic: the same as on a float32 copy.
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5, logprobs=2) for _ in range(6)]
    a, b = fill(params), fill(params)
    got, want = step(a, logits.clone()), step(b, logits.float())
    assert got.sampled_token_ids.tolist() == want.sampled_token_ids.tolist()
    assert got.logprobs.logprobs.dtype == torch.float32
    torch.testing.assert_close(got.logprobs.logprobs, want.logprobs.logprobs)


def test_only_steps_that_compute_with_their_logits_copy_them_to_float32():
    greedy = SamplingParams(temperature=0.0)
    assert not Sampler.needs_float32(fill([greedy, greedy]).refresh())
    for other in (SamplingParams(temperature=0.8), SamplingParams(temperature=0.0, logprobs=1),
                  SamplingParams(temperature=0.0, presence_penalty=0.5),
                  SamplingParams(temperature=0.0, logit_bias={5: 10.0})):  # an active processor
        assert Sampler.needs_float32(fill([greedy, other]).refresh()), other
    # ... and it still moves the argmax of a bfloat16 batch.
    logits = torch.zeros(2, VOCAB, dtype=torch.bfloat16)
    out = step(fill([greedy, SamplingParams(temperature=0.0, logit_bias={5: 10.0})]), logits)
    assert out.sampled_token_ids.tolist() == [0, 5]


def test_greedy_rows_stay_greedy_in_a_mixed_batch():
    logits = _logits(4, seed=1)
    batch = fill([SamplingParams(temperature=0.0), SamplingParams(), SamplingParams(temperature=0.0),
                  SamplingParams(seed=3)])
    for _ in range(5):
        out = step(batch, logits)
        assert out.sampled_token_ids[[0, 2]].tolist() == logits[[0, 2]].argmax(-1).tolist()


def _seeded_run(others_before: int, others_after: int, steps: int = 8) -> list[int]:
    """Run a seeded request among random neighbours; return its tokens."""
    params = [SamplingParams(temperature=1.3) for _ in range(others_before)]
    params.append(SamplingParams(temperature=1.0, seed=1234, top_p=0.95))
    params += [SamplingParams(seed=99 + i) for i in range(others_after)]
    batch = fill(params)
    target = f"r{others_before}"
    for t in range(steps):
        logits = _logits(len(params), seed=100 + t * 7 + len(params))
        # Same logits for the seeded request whatever the batch looks like.
        logits[batch.req_id_to_index[target]] = _logits(1, seed=t)[0]
        step(batch, logits)
    return list(batch.output_token_ids(target))


def test_seeded_sampling_is_reproducible_regardless_of_batch_and_row():
    alone = _seeded_run(0, 0)
    assert _seeded_run(3, 0) == alone
    assert _seeded_run(0, 4) == alone
    assert _seeded_run(2, 5) == alone
    # The noise really is random: the request does not just pick the argmax.
    assert alone != [int(_logits(1, seed=t)[0].argmax()) for t in range(8)]


def test_seeded_request_survives_condense_moves():
    batch = fill([SamplingParams() for _ in range(3)] + [SamplingParams(seed=5)])
    ref = fill([SamplingParams(seed=5)])
    for t in range(6):
        if t == 2:
            batch.remove_request("r0")  # r3 moves into row 0 on condense
        rows = batch.num_reqs if t >= 2 else 4
        logits = _logits(rows, seed=50 + t)
        row_logits = _logits(1, seed=t)[0]
        step(ref, row_logits.unsqueeze(0))
        batch.refresh()  # condense now so the row of r3 is known
        logits[batch.req_id_to_index["r3"]] = row_logits
        step(batch, logits)
    assert batch.req_ids[0] == "r3"
    assert batch.output_token_ids("r3") == ref.output_token_ids("r0")


def test_different_seeds_give_different_tokens():
    logits = torch.zeros(1, VOCAB)  # uniform: any pick is equally likely
    runs = []
    for seed in (1, 2):
        batch = fill([SamplingParams(seed=seed)])
        for _ in range(10):
            step(batch, logits)
        runs.append(batch.output_token_ids("r0"))
    assert runs[0] != runs[1]


def test_top_k_1_and_tiny_top_p_equal_greedy():
    logits = _logits(6, seed=3)
    params = [SamplingParams(top_k=1)] * 3 + [SamplingParams(top_p=1e-6, seed=i) for i in range(3)]
    batch = fill(params)
    for _ in range(5):
        out = step(batch, logits)
        assert out.sampled_token_ids.tolist() == logits.argmax(-1).tolist()


def test_top_k_restricts_to_k_most_likely():
    logits = _logits(1, seed=4).expand(400, VOCAB).contiguous()
    batch = fill([SamplingParams(top_k=3, temperature=2.0) for _ in range(400)])  # (2: the highest allowed)
    out = step(batch, logits)
    allowed = set(logits[0].topk(3).indices.tolist())
    assert set(out.sampled_token_ids.tolist()) == allowed


def test_min_p_filters_unlikely_tokens():
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05] + [0.0] * (VOCAB - 5)) + 1e-12
    logits = probs.log().expand(500, VOCAB).contiguous()
    batch = fill([SamplingParams(min_p=0.5) for _ in range(250)] + [SamplingParams() for _ in range(250)])
    out = step(batch, logits).sampled_token_ids.tolist()
    # min_p=0.5 keeps tokens with p >= 0.2: only 0 and 1; the other rows are unfiltered.
    assert set(out[:250]) == {0, 1}
    assert set(out[250:]) - {0, 1}


def test_logit_bias_applies_before_the_repetition_penalty_as_in_vllm():
    # Token 1 is in the prompt ([1, 2, 3]): its logit 1.0, biased by -0.8, is 0.2, which
    # the penalty halves to 0.1 -- above token 0's 0.0. The penalty first (0.5 - 0.8 < 0)
    # would hand the argmax to token 0.
    logits = torch.full((1, VOCAB), -10.0)
    logits[0, 0], logits[0, 1] = 0.0, 1.0
    batch = fill([SamplingParams(temperature=0, logit_bias={1: -0.8}, repetition_penalty=2.0)])
    assert step(batch, logits).sampled_token_ids.tolist() == [1]


def test_min_p_applies_before_top_k_and_top_p_as_in_vllm():
    # p = [.5, .3, .1, .1]: min_p=0.3 keeps p >= .15, tokens 0 and 1 (.625 / .375 after
    # renormalising); top_p=0.6 then keeps token 0 alone. Top-p first (over the whole
    # row: tokens 0 and 1) would leave token 1 to be drawn too.
    probs = torch.tensor([0.5, 0.3, 0.1, 0.1] + [0.0] * (VOCAB - 4)) + 1e-12
    logits = probs.log().expand(300, VOCAB).contiguous()
    batch = fill([SamplingParams(min_p=0.3, top_p=0.6) for _ in range(150)]
                 + [SamplingParams(min_p=0.3, top_k=3) for _ in range(150)])
    out = step(batch, logits).sampled_token_ids.tolist()
    assert set(out[:150]) == {0}
    assert set(out[150:]) == {0, 1}


def test_penalties_change_the_right_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]])
    vocab = 5
    prompt = torch.tensor([[1, vocab]])  # token 1 in the prompt; padding = vocab
    output = torch.tensor([[2, 2, 3, vocab]])  # token 2 twice, token 3 once
    out = apply_penalties(
        logits, prompt, output,
        presence_penalties=torch.tensor([0.5]),
        frequency_penalties=torch.tensor([0.25]),
        repetition_penalties=torch.tensor([2.0]),
    )
    expected = [
        2.0,  # never seen
        -4.0,  # prompt only: negative logit multiplied by the repetition penalty
        1.0 / 2 - 2 * 0.25 - 0.5,  # output twice: divided, then frequency x2, presence
        0.5 / 2 - 0.25 - 0.5,
        3.0,
    ]
    assert torch.allclose(out[0], torch.tensor(expected))


def test_frequency_penalty_changes_greedy_choice_through_the_batch():
    logits = torch.full((2, VOCAB), -5.0)
    logits[:, 0], logits[:, 1] = 2.0, 1.9
    batch = fill([SamplingParams(temperature=0, frequency_penalty=0.2), SamplingParams(temperature=0)])
    assert step(batch, logits).sampled_token_ids.tolist() == [0, 0]
    # Token 0 now occurs once: 2.0 - 0.2 < 1.9 for the penalized row only.
    assert step(batch, logits).sampled_token_ids.tolist() == [1, 0]


def test_repetition_penalty_uses_prompt_tokens():
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 2], logits[0, 7] = 3.0, 2.0  # token 2 is in the prompt [1, 2, 3]
    batch = fill([SamplingParams(temperature=0, repetition_penalty=1.6)])
    assert step(batch, logits).sampled_token_ids.tolist() == [7]


def test_logprobs_ranks_and_top_k():
    logits = _logits(3, seed=8)
    batch = fill([SamplingParams(logprobs=3, seed=1), SamplingParams(logprobs=0, temperature=0),
                  SamplingParams()])
    metadata = batch.refresh()
    out = Sampler()(logits.clone(), metadata)
    rows = out.logprobs.tolists(metadata.num_logprobs)
    reference = torch.log_softmax(logits, -1)
    sampled = out.sampled_token_ids.tolist()

    ids, lps, rank = rows[0]
    assert len(ids) == 4 and ids[0] == sampled[0]
    assert ids[1:] == reference[0].topk(3).indices.tolist()
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(lps, reference[0][ids].tolist()))
    assert rank == int((reference[0] > reference[0][sampled[0]]).sum()) + 1
    assert rows[1] == ([sampled[1]], [reference[1][sampled[1]].item()], 1)  # greedy: rank 1
    assert rows[2] is None


def test_raw_logprobs_ignore_processors_processed_ones_do_not():
    logits = torch.zeros(1, VOCAB)
    params = SamplingParams(temperature=0, logprobs=1, logit_bias={4: 50.0})
    raw = step(fill([params]), logits, Sampler("raw_logprobs")).logprobs
    processed = step(fill([params]), logits, Sampler("processed_logprobs")).logprobs
    assert raw.token_ids[0, 0] == processed.token_ids[0, 0] == 4
    assert math.isclose(raw.logprobs[0, 0].item(), -math.log(VOCAB), rel_tol=1e-5)
    assert processed.logprobs[0, 0].item() > -1e-6
