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


def test_allowed_token_ids_restricts_every_sample_only_in_its_row():
    from forkless.logits_processors import AllowedTokenIdsLogitsProcessor

    assert not AllowedTokenIdsLogitsProcessor(None, torch.device("cpu"), False).is_argmax_invariant()
    torch.manual_seed(0)
    allowed = [3, 17, 30]
    batch = fill([
        SamplingParams(temperature=1.0, allowed_token_ids=allowed),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, allowed_token_ids=[5]),
    ])
    seen = set()
    for _ in range(60):
        logits = torch.randn(3, VOCAB) * 3
        out = step(batch, logits).sampled_token_ids.tolist()
        assert out[0] in allowed
        assert out[1] == int(logits[1].argmax())  # an unrestricted row is untouched
        assert out[2] == 5  # greedy rows pick among the allowed tokens too
        seen.add(out[0])
    assert seen == set(allowed)  # still a distribution over all of them


def test_allowed_token_ids_follow_their_row_when_rows_move():
    batch = fill([SamplingParams(temperature=0), SamplingParams(temperature=0, allowed_token_ids=[4])])
    logits = torch.randn(2, VOCAB)
    logits[:, 4] = -50.0
    assert step(batch, logits).sampled_token_ids.tolist()[1] == 4
    batch.remove_request("r0")  # condense moves r1 into row 0
    out = step(batch, logits[1:]).sampled_token_ids.tolist()
    assert batch.req_ids == ["r1"] and out == [4]


def _bad_words_params(sequences: list[list[int]], **kwargs) -> SamplingParams:
    params = SamplingParams(temperature=0, bad_words=["placeholder"], **kwargs)
    params.bad_words_token_ids = sequences  # what update_from_tokenizer fills in
    return params


def test_bad_words_ban_the_last_token_only_after_the_rest_of_the_word():
    # Logits prefer 7, then 8, then 9: greedy would write 7 7 7 ...
    logits = torch.zeros(2, VOCAB)
    logits[:, 7], logits[:, 8], logits[:, 9] = 3.0, 2.0, 1.0
    batch = fill([_bad_words_params([[7, 7], [8]]), SamplingParams(temperature=0)])
    picks = [step(batch, logits).sampled_token_ids.tolist() for _ in range(4)]
    # 7 is allowed first, then banned after a 7 (the word "7 7"); 8 is always banned.
    assert [p[0] for p in picks] == [7, 9, 7, 9]
    assert [p[1] for p in picks] == [7] * 4  # another row is untouched


def test_bad_words_match_the_output_only_not_the_prompt():
    logits = torch.zeros(1, VOCAB)
    logits[0, 7] = 3.0
    batch = make_batch()
    batch.add_request("r", _bad_words_params([[3, 7]]), [1, 2, 3])  # the prompt ends in 3
    assert step(batch, logits).sampled_token_ids.tolist() == [7]


def test_untokenized_bad_words_are_an_error_not_ignored():
    import pytest

    batch = fill([SamplingParams(temperature=0, bad_words=["x"])])
    with pytest.raises(RuntimeError, match="update_from_tokenizer"):
        step(batch, torch.zeros(1, VOCAB))


# -- thinking_token_budget ------------------------------------------------------------------
START, END = [20, 21], [22, 23]  # two-token markers, as "<think>" is in many vocabularies


def _budget(budget: int | None, **kwargs) -> SamplingParams:
    kwargs.setdefault("temperature", 0)
    return SamplingParams(thinking_token_budget=budget, reasoning_start_token_ids=START,
                          reasoning_end_token_ids=END, **kwargs)


def _think(batch, steps: int, favourite: int = 9) -> list[list[int]]:
    """``steps`` greedy steps on logits that always favour ``favourite`` (a model that
    would think forever); each step's tokens."""
    logits = torch.zeros(batch.num_reqs, VOCAB)
    logits[:, favourite] = 10.0
    return [step(batch, logits).sampled_token_ids.tolist() for _ in range(steps)]


def test_thinking_budget_forces_the_end_marker_after_that_many_reasoning_tokens():
    batch = make_batch()
    batch.add_request("opened", _budget(3), [1] + START)  # the template opened the reasoning
    batch.add_request("free", SamplingParams(temperature=0), [1] + START)
    batch.add_request("none", _budget(None), [1] + START)
    _think(batch, 7)
    assert batch.output_token_ids("opened") == [9, 9, 9] + END + [9, 9]
    assert batch.output_token_ids("free") == [9] * 7
    assert batch.output_token_ids("none") == [9] * 7


def test_thinking_budget_counts_from_a_start_marker_the_model_writes_and_again_after_a_new_one():
    batch = make_batch()
    batch.add_request("r", _budget(2), [1, 2])
    logits = torch.zeros(1, VOCAB)
    picks = []
    for favourite in [START[0], START[1], 9, 9, 9, 9, 9, START[0], START[1], 9, 9, 9, 9]:
        logits.zero_()
        logits[0, favourite] = 10.0
        picks.append(step(batch, logits).sampled_token_ids.item())
    # Not reasoning before the marker; two tokens of it, the end; the same after a new start.
    assert picks == START + [9, 9] + END + [9] + START + [9, 9] + END


def test_thinking_budget_zero_and_a_prompt_past_the_budget_end_the_reasoning_at_once():
    batch = make_batch()
    batch.add_request("zero", _budget(0), [1] + START)
    batch.add_request("past", _budget(2), [1] + START + [5, 5, 5, 5])
    batch.add_request("closed", _budget(0), [1] + START + [5] + END)  # the prompt ended it
    _think(batch, 3)
    assert batch.output_token_ids("zero") == END + [9]
    assert batch.output_token_ids("past") == END + [9]
    assert batch.output_token_ids("closed") == [9, 9, 9]


def test_thinking_budget_overrides_masks_and_sampling_and_follows_its_row():
    batch = make_batch()
    batch.add_request("a", SamplingParams(temperature=0), [1])
    batch.add_request("b", _budget(1, allowed_token_ids=[9], top_k=1), [1] + START)
    batch.add_request("c", _budget(1, temperature=1.0, seed=3), [1] + START)
    _think(batch, 1)
    batch.remove_request("a")  # b and c move down a row
    _think(batch, 3)
    assert batch.output_token_ids("b") == [9] + END + [9]
    assert batch.output_token_ids("c")[1:3] == END


def test_thinking_budget_resumes_a_forced_end_marker_it_was_writing():
    # A preempted request comes back with its output: the marker goes on where it was.
    batch = make_batch()
    batch.add_request("r", _budget(2), [1] + START, output_token_ids=[9, 9, END[0]])
    _think(batch, 2)
    assert batch.output_token_ids("r") == [9, 9] + END + [9]


def test_thinking_budget_without_markers_is_an_error_not_ignored():
    batch = make_batch()
    batch.add_request("r", SamplingParams(thinking_token_budget=2), [1])
    try:
        batch.refresh()
    except Exception as exc:  # LogitsProcessorError, naming the processor
        assert "reasoning_start_token_ids" in str(exc)
    else:
        raise AssertionError("a budget without markers was ignored")
