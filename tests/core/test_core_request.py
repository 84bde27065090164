"""Request bookkeeping and status / finish-reason mapping."""

from __future__ import annotations

import pytest

from core_fakes import Params, make_request, make_scheduler
from forkless.core.request import FinishReason, Request, RequestStatus
from forkless.core.sched import ModelRunnerOutput


def test_request_tracks_tokens() -> None:
    r = Request("r", [5, 6, 7], Params(max_tokens=3, stop_token_ids=[9]), eos_token_id=2, priority=4)
    assert (r.num_prompt_tokens, r.num_tokens, r.num_output_tokens) == (3, 3, 0)
    r.append_output_token(8)
    assert r.all_token_ids == [5, 6, 7, 8] and r.output_token_ids == [8]
    assert r.prompt_token_ids == [5, 6, 7]
    assert r.stop_token_ids == frozenset({9}) and r.eos_token_ids == frozenset({2})
    assert r.status is RequestStatus.WAITING and not r.is_finished
    assert r.num_cached_tokens == -1 and r.priority == 4


def test_eos_ids_from_sampling_params_count_too() -> None:
    r = Request("r", [1], Params(eos_token_ids=[3, 4]), eos_token_id=2)
    assert r.eos_token_ids == frozenset({2, 3, 4})


def test_finish_reasons() -> None:
    assert RequestStatus.FINISHED_STOPPED.finish_reason is FinishReason.STOP
    assert RequestStatus.FINISHED_LENGTH_CAPPED.finish_reason is FinishReason.LENGTH
    assert RequestStatus.FINISHED_ABORTED.finish_reason is FinishReason.ABORT
    assert RequestStatus.PREEMPTED.finish_reason is None and not RequestStatus.PREEMPTED.is_finished
    assert RequestStatus.from_finish_reason("abort") is RequestStatus.FINISHED_ABORTED
    assert str(FinishReason.LENGTH) == "length" and FinishReason.STOP == "stop"


def test_finish_requests_with_other_reasons() -> None:
    s, _ = make_scheduler()
    r = make_request("r", 4)
    s.add_request(r)
    s.finish_requests("r", FinishReason.STOP)  # e.g. the API server matched a stop string
    assert r.status is RequestStatus.FINISHED_STOPPED and r.finish_reason is FinishReason.STOP


def test_runner_must_sample_when_asked() -> None:
    s, _ = make_scheduler()
    s.add_request(make_request("r", 4))
    out = s.schedule()
    with pytest.raises(RuntimeError, match="no token"):
        s.update_from_output(out, ModelRunnerOutput())
