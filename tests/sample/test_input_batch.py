"""InputBatch: rows, holes, condense, and the BatchUpdate it reports."""

import pytest

from forkless import SamplingParams
from forkless.logits_processors import MoveDirectionality
from sample_helpers import make_batch

U = MoveDirectionality.UNIDIRECTIONAL


def _filled(n: int):
    batch = make_batch()
    for i in range(n):
        batch.add_request(f"r{i}", SamplingParams(), [i])
    return batch


def test_first_update_reports_every_added_row_with_live_output_list():
    batch = make_batch()
    outputs = [7]
    batch.add_request("a", SamplingParams(), [1, 2], outputs)
    update = batch.pop_batch_update()
    assert update.batch_size == 1 and update.removed == [] and update.moved == []
    index, params, prompt, out = update.added[0]
    assert index == 0 and prompt == [1, 2]
    batch.append_output_token("a", 9)
    assert out is outputs and out == [7, 9]
    assert batch.pop_batch_update() is None  # nothing changed since


def test_condense_moves_last_rows_into_holes():
    batch = _filled(5)
    batch.pop_batch_update()
    batch.remove_request("r1")
    batch.remove_request("r3")
    update = batch.pop_batch_update()
    assert update.batch_size == 3
    assert update.removed == [1, 3]
    assert update.added == []
    assert update.moved == [(4, 1, U)]  # row 3's hole is at the new end: nothing to move
    assert batch.req_ids == ["r0", "r4", "r2"]
    assert batch.req_id_to_index == {"r0": 0, "r4": 1, "r2": 2}


def test_added_request_reuses_the_lowest_hole():
    batch = _filled(4)
    batch.pop_batch_update()
    batch.remove_request("r2")
    batch.remove_request("r0")
    assert batch.add_request("x", SamplingParams(), [9]) == 0
    update = batch.pop_batch_update()
    assert update.removed == [2] and [a[0] for a in update.added] == [0]
    assert update.moved == [(3, 2, U)]
    assert batch.req_ids == ["x", "r1", "r3"]


def test_add_then_remove_in_one_step_never_reaches_processors():
    batch = _filled(2)
    batch.pop_batch_update()
    batch.add_request("tmp", SamplingParams(), [1])
    batch.remove_request("tmp")
    update = batch.pop_batch_update()
    assert update.added == [] and update.removed == [2] and update.batch_size == 2


def test_swap_is_reported_as_swap():
    batch = _filled(3)
    batch.pop_batch_update()
    batch.swap_rows(0, 2)
    assert batch.pop_batch_update().moved == [(0, 2, MoveDirectionality.SWAP)]
    assert batch.req_ids == ["r2", "r1", "r0"]


def test_misuse_is_a_clear_error():
    batch = _filled(3)
    with pytest.raises(ValueError, match="already in the batch"):
        batch.add_request("r0", SamplingParams(), [1])
    batch.pop_batch_update()
    batch.remove_request("r0")
    batch.condense()
    with pytest.raises(RuntimeError, match="refresh"):
        batch.add_request("late", SamplingParams(), [1])
    assert batch.remove_request("missing") is None
    full = make_batch()
    full.max_num_reqs = 1
    full.add_request("a", SamplingParams(), [1])
    with pytest.raises(ValueError, match="full"):
        full.add_request("b", SamplingParams(), [1])


def test_metadata_reflects_rows_in_order():
    batch = make_batch()
    batch.add_request("g", SamplingParams(temperature=0, logprobs=2), [1])
    batch.add_request("s", SamplingParams(seed=4, top_k=5, top_p=0.5), [1])
    md = batch.refresh()
    assert not md.all_greedy and not md.all_random
    assert md.temperature.tolist() == [0.0, 1.0]
    assert md.top_k.tolist() == [batch.vocab_size, 5]
    assert md.top_p.tolist() == [1.0, 0.5]
    assert list(md.generators) == [1]
    assert md.max_num_logprobs == 2 and md.num_logprobs == [2, None]
    assert md.no_penalties and md.output_token_ids is None
