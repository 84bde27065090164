"""One request for many sequences does not take every slot (``max_running_seqs_per_request``).

The ``n`` children and the prompts of one API request share a ``Request.group_id``. With
the limit, at most that many of a group's sequences run at once; its other sequences wait
without blocking the requests queued behind them, and the group's next sequences are
admitted as its running ones finish. At 0 (vLLM's behaviour) a group may fill
``max_num_seqs``. ``core_fakes.check_step`` asserts the limit (and the scheduler's
per-group counts) after every step of every scheduler test.
"""

from __future__ import annotations

import pytest

from core_fakes import Result, assert_no_leaks, default_token, make_request, make_scheduler, run_all, step
from forkless.core.request import FinishReason
from forkless.core.sched import SchedulerConfig

GROUP = 32


def add_group(s, name: str = "big", size: int = GROUP, max_tokens: int = 16) -> list[str]:  # noqa: ANN001
    ids = [f"{i}_{name}" for i in range(size)]
    for rid in ids:
        s.add_request(make_request(rid, 4, max_tokens=max_tokens, ignore_eos=True, group_id=name))
    return ids


def running_of(s, group: str) -> int:  # noqa: ANN001
    return sum(1 for r in s.running if r.group_id == group)


def test_a_request_behind_a_big_one_is_admitted_at_once_and_decodes_next_to_a_few_of_it() -> None:
    s, runner = make_scheduler(num_blocks=512, max_num_seqs=GROUP, max_running_seqs_per_request=4)
    results: dict[str, Result] = {}
    big = add_group(s)
    step(s, runner, results)
    assert running_of(s, "big") == 4
    s.add_request(make_request("small", 4, max_tokens=8, ignore_eos=True))
    # Queued behind 28 of the big request's sequences, it is admitted in the next step.
    out = step(s, runner, results)
    assert "small" in {item.request_id for item in out.scheduled_requests}
    # And every step until it is done carries it next to at most 4 of the big request's.
    while results.get("small", Result()).finish_reason is None:
        out = step(s, runner, results)
        assert len(out.scheduled_requests) <= 5
    assert len(results["small"].token_ids) == 8
    # The big request is served all the same, 4 at a time, every sequence in full.
    run_all(s, runner, results)
    for rid in big:
        assert results[rid].token_ids == [default_token(rid, i) for i in range(16)]
    assert_no_leaks(s)


def test_without_the_limit_a_big_request_takes_every_slot() -> None:
    s, runner = make_scheduler(num_blocks=512, max_num_seqs=GROUP)
    results: dict[str, Result] = {}
    add_group(s)
    step(s, runner, results)
    assert running_of(s, "big") == GROUP  # vLLM's behaviour, the default
    s.add_request(make_request("small", 4, max_tokens=8, ignore_eos=True))
    out = step(s, runner, results)
    assert "small" not in {item.request_id for item in out.scheduled_requests}
    run_all(s, runner, results)
    assert_no_leaks(s)


def test_groups_take_turns_with_each_other_and_keep_their_order() -> None:
    s, runner = make_scheduler(num_blocks=512, max_num_seqs=8, max_running_seqs_per_request=3)
    results: dict[str, Result] = {}
    a = add_group(s, "a", size=6, max_tokens=4)
    b = add_group(s, "b", size=6, max_tokens=4)
    out = step(s, runner, results)
    assert [i.request_id for i in out.scheduled_requests] == a[:3] + b[:3]
    first_token_step: dict[str, int] = {}
    for n in range(1, 100):
        if not s.has_unfinished_requests():
            break
        out = step(s, runner, results)
        for item in out.scheduled_requests:
            first_token_step.setdefault(item.request_id, n)
    # Each group's later sequences start in their queue order, as its earlier ones finish.
    assert [first_token_step[rid] for rid in a[3:]] == sorted(first_token_step[rid] for rid in a[3:])
    assert all(len(results[rid].token_ids) == 4 for rid in a + b)
    assert_no_leaks(s)


def test_aborts_and_preemption_give_the_group_its_slots_back() -> None:
    # A cache too small for every sequence at once: preemption happens.
    s, runner = make_scheduler(num_blocks=12, max_model_len=32, max_num_seqs=16, max_running_seqs_per_request=4)
    results: dict[str, Result] = {}
    big = add_group(s, size=10, max_tokens=20)
    for rid in ("x", "y"):
        s.add_request(make_request(rid, 4, max_tokens=20, ignore_eos=True))
    for _ in range(3):
        step(s, runner, results)
    s.finish_requests(big[:2], FinishReason.ABORT)  # running ones
    s.finish_requests(big[-1], FinishReason.ABORT)  # a waiting one
    run_all(s, runner, results)  # check_step holds the counts to the running list throughout
    assert s.num_preemptions > 0
    assert all(len(results[rid].token_ids) == 20 for rid in big[2:-1] + ["x", "y"])
    assert_no_leaks(s)


@pytest.mark.parametrize("value", [-1, 1.5, True, "4"])
def test_a_bad_limit_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=f"max_running_seqs_per_request must be an integer >= 0.*{value!r}"):
        SchedulerConfig(max_model_len=64, max_running_seqs_per_request=value)  # type: ignore[arg-type]
