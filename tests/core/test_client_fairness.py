"""One client with many requests does not take every step (``max_prefill_tokens_per_client``).

Requests carry the client that sent them (``Request.client_key``: the API server's ``user``
field or peer address; ``None`` offline). With the share R, while requests of more than one
client are running or waiting, each client earns R prompt tokens a step, holding at most
2R: one client's prefills compute at most 2R tokens in a step and R a step on average; its
prompts that its credit does not cover wait (keeping their places) and other clients'
requests behind them are admitted in the same step. A client alone, and the offline
engine (every request ``None``), are scheduled exactly as without the share.
Count-based: steps and tokens, no clocks.
"""

from __future__ import annotations

from collections import Counter

import pytest

from core_fakes import Result, assert_no_leaks, default_token, make_request, make_scheduler, run_all, step
from forkless.core.sched import SchedulerConfig

CAP = 8  # R: 8 prompt tokens a step, bursts of 16


def add(s, rid: str, client: str | None, prompt: int = 16, max_tokens: int = 4) -> str:  # noqa: ANN001
    request = make_request(rid, prompt, max_tokens=max_tokens, ignore_eos=True)
    request.client_key = client
    s.add_request(request)
    return rid


def prefill_tokens_by_client(s, out) -> Counter:  # noqa: ANN001
    """Prompt tokens each client computed in the step ``out`` (before it is applied)."""
    used: Counter = Counter()
    for item in out.scheduled_requests:
        request = s.requests.get(item.request_id)
        if request is not None and len(item.token_ids) > 1:
            used[request.client_key] += len(item.token_ids)
    return used


def test_a_second_clients_prompt_is_admitted_in_the_first_step_next_to_one_of_the_many() -> None:
    s, runner = make_scheduler(num_blocks=512, max_model_len=128, max_prefill_tokens_per_client=CAP)
    results: dict[str, Result] = {}
    many = [add(s, f"a{i}", "ip:a", max_tokens=2) for i in range(30)]
    add(s, "b", "ip:b", max_tokens=8)
    out = step(s, runner, results)
    # Queued behind 30 of client a's prompts: a gets one (16 tokens, a full burst), b its own.
    assert [item.request_id for item in out.scheduled_requests] == ["a0", "b"]
    assert prefill_tokens_by_client(s, out) == {"ip:a": 2 * CAP, "ip:b": 16}
    # b then decodes in every step, next to a new prompt of a's every other step.
    steps, a_tokens = 1, 2 * CAP
    while "b" in s.requests:
        out = step(s, runner, results)
        steps += 1
        a_tokens += prefill_tokens_by_client(s, out)["ip:a"]
        assert "b" in {item.request_id for item in out.scheduled_requests}
        assert a_tokens <= 2 * CAP + CAP * (steps - 1)
    assert steps == 8  # one step per token: never passed over
    assert a_tokens == 4 * 16  # a0, then one of a's prompts in steps 3, 5 and 7
    run_all(s, runner, results)
    for rid in many:
        assert results[rid].token_ids == [default_token(rid, i) for i in range(2)]
    assert_no_leaks(s)
    assert not s._client_requests


def test_without_the_cap_the_many_prompts_fill_the_step() -> None:
    s, _ = make_scheduler(num_blocks=512, max_model_len=128)
    for i in range(30):
        add(s, f"a{i}", "ip:a")
    add(s, "b", "ip:b")
    out = s.schedule()
    assert len(out.scheduled_requests) == 31  # vLLM's behaviour: 496 prompt tokens in one step


def test_every_step_keeps_each_client_under_the_cap_and_every_client_progresses() -> None:
    rate = 4
    s, runner = make_scheduler(num_blocks=512, max_model_len=128, max_prefill_tokens_per_client=rate)
    results: dict[str, Result] = {}
    # A long prompt of client a is chunked to the client's credit; a's short prompts wait
    # their turn; c's and b's requests get their share in every step.
    add(s, "a-long", "ip:a", prompt=60, max_tokens=3)
    for i in range(5):
        add(s, f"a{i}", "ip:a", prompt=6, max_tokens=3)
    add(s, "b", "ip:b", prompt=20, max_tokens=3)
    add(s, "c", None, prompt=3, max_tokens=3)
    client_of = {rid: r.client_key for rid, r in s.requests.items()}
    first_token_step: dict[str, int] = {}
    total: Counter = Counter()
    contended_steps = 0
    for n in range(1, 200):
        if not s.has_unfinished_requests():
            break
        several = len(s._client_requests) > 1
        out = step(s, runner, results)
        per_client: Counter = Counter()
        for item in out.scheduled_requests:
            if len(item.token_ids) > 1:
                per_client[client_of[item.request_id]] += len(item.token_ids)
        if several:
            contended_steps += 1
            total.update(per_client)
            assert max(per_client.values(), default=0) <= 2 * rate, (n, per_client)
            assert max(total.values()) <= 2 * rate + rate * (contended_steps - 1), (n, total)
        for rid, result in results.items():
            if result.token_ids:
                first_token_step.setdefault(rid, n)
    else:
        raise AssertionError("not finished")
    # Step 1: each client's burst (a-long 8, b 8, c its 3); then 4 a step: b's 20 tokens
    # are done in step 4, its last token in step 6; a-long had 8 + 5 x 4 = 28 of its 60 by
    # then, and the rest at once in step 7, when a was alone. a's short prompts waited.
    assert first_token_step["c"] == 1
    assert first_token_step["b"] == 4
    assert first_token_step["a-long"] == 7
    assert min(first_token_step[f"a{i}"] for i in range(5)) == 7
    for rid in ("a-long", "b", "c"):
        assert results[rid].token_ids == [default_token(rid, i) for i in range(3)]
    assert_no_leaks(s)
    assert not s._client_requests


def plan(cap: int, clients: list[str | None], **kw: object) -> list[list[tuple[str, int]]]:
    """Every step's (request, tokens) for 12 prompts of mixed length spread over ``clients``."""
    s, runner = make_scheduler(num_blocks=96, max_model_len=128, max_prefill_tokens_per_client=cap, **kw)
    for i in range(12):
        add(s, f"r{i}", clients[i % len(clients)], prompt=5 + 11 * i % 70, max_tokens=6)
    steps = []
    results: dict[str, Result] = {}
    while s.has_unfinished_requests():
        out = step(s, runner, results)
        steps.append([(item.request_id, len(item.token_ids)) for item in out.scheduled_requests])
        assert len(steps) < 1000
    assert_no_leaks(s)
    return steps


@pytest.mark.parametrize("kw", [{}, {"long_prefill_token_threshold": 16, "max_num_batched_tokens": 64}])
def test_one_client_or_the_offline_engine_is_scheduled_exactly_as_without_the_cap(kw: dict) -> None:
    assert plan(CAP, [None], **kw) == plan(0, [None], **kw)
    assert plan(CAP, ["user:x"], **kw) == plan(0, ["user:x"], **kw)
    # And with two clients the cap changes the plan (the test above can fail).
    assert plan(CAP, ["ip:a", "ip:b"], **kw) != plan(0, ["ip:a", "ip:b"], **kw)


def test_preemption_gives_back_the_victims_share() -> None:
    # A cache too small for everyone: running requests are preempted and readmitted
    # while two clients take turns; everything still finishes with the right tokens.
    s, runner = make_scheduler(num_blocks=20, max_model_len=64, max_prefill_tokens_per_client=CAP)
    for i in range(6):
        add(s, f"a{i}", "ip:a", prompt=10, max_tokens=20)
        add(s, f"b{i}", "ip:b", prompt=10, max_tokens=20)
    results = run_all(s, runner)
    assert s.num_preemptions > 0
    for rid, result in results.items():
        assert result.token_ids == [default_token(rid, i) for i in range(20)]
    assert_no_leaks(s)
    assert not s._client_requests


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_a_bad_value_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=f"max_prefill_tokens_per_client must be an integer >= 0.*{value!r}"):
        SchedulerConfig(max_model_len=64, max_prefill_tokens_per_client=value)  # type: ignore[arg-type]
