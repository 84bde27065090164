"""Configuration validation, add_request refusals, and --scheduler-cls resolution."""

from __future__ import annotations

import logging

import pytest

from core_fakes import CustomScheduler, make_request, make_scheduler
from forkless.core.sched import (
    KVCacheConfig,
    Scheduler,
    SchedulerConfig,
    SchedulerInterface,
    get_scheduler_cls,
)
from forkless.plugins import PluginImportError, Stability, tier_of


def test_scheduler_config_defaults() -> None:
    cfg = SchedulerConfig(max_model_len=2048)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.policy) == (256, 8192, "fcfs")
    assert cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold == 0
    assert (cfg.max_num_partial_prefills, cfg.max_long_partial_prefills) == (None, 1)
    kv = KVCacheConfig(num_blocks=10)
    assert (kv.block_size, kv.enable_prefix_caching, kv.prefix_caching_hash_algo) == (16, True, "sha256")


def test_bad_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'lifo'.*fcfs, priority"):
        SchedulerConfig(max_model_len=64, policy="lifo")


@pytest.mark.parametrize("field", ["max_model_len", "max_num_seqs", "max_num_batched_tokens"])
def test_non_positive_limits(field: str) -> None:
    kwargs = {"max_model_len": 64, field: 0}
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


def test_unchunked_budget_must_fit_a_whole_prompt() -> None:
    with pytest.raises(ValueError, match="chunked prefill"):
        SchedulerConfig(max_model_len=64, max_num_batched_tokens=32, enable_chunked_prefill=False)
    SchedulerConfig(max_model_len=64, max_num_batched_tokens=32)  # chunked: fine


def test_kv_cache_must_hold_one_full_sequence() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(SchedulerConfig(max_model_len=65), KVCacheConfig(num_blocks=4, block_size=16))
    Scheduler(SchedulerConfig(max_model_len=64), KVCacheConfig(num_blocks=4, block_size=16))


def test_add_request_refuses_what_can_never_run() -> None:
    s, _ = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError, match="no room"):
        s.add_request(make_request("long", 16))
    with pytest.raises(ValueError, match="empty"):
        s.add_request(make_request("empty", []))
    s.add_request(make_request("ok", 15))
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(make_request("ok", 3))
    assert s.get_num_unfinished_requests() == 1


def test_scheduler_interface_is_internal() -> None:
    assert tier_of(SchedulerInterface) is Stability.INTERNAL
    assert issubclass(Scheduler, SchedulerInterface)
    assert get_scheduler_cls(None) is Scheduler
    assert get_scheduler_cls("forkless.core.sched.scheduler:Scheduler") is Scheduler


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_custom_scheduler_class_path_warns_once() -> None:
    # Our own handler: the forkless logger may not propagate to pytest's caplog.
    capture = _Capture()
    logger = logging.getLogger("forkless.plugins")
    logger.addHandler(capture)
    try:
        for spelling in ("core_fakes:CustomScheduler", "core_fakes.CustomScheduler", CustomScheduler):
            assert get_scheduler_cls(spelling) is CustomScheduler
    finally:
        logger.removeHandler(capture)
    warnings = [m for m in capture.messages if "CustomScheduler" in m]
    assert len(warnings) == 1
    assert "--scheduler-cls" in warnings[0] and "internal" in warnings[0]
    # And it actually schedules.
    s = CustomScheduler(SchedulerConfig(max_model_len=32), KVCacheConfig(num_blocks=8, block_size=4))
    s.add_request(make_request("a", 4))
    assert s.schedule().num_batched_tokens == 4


def test_non_subclass_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="SchedulerInterface"):
        get_scheduler_cls("core_fakes:NotAScheduler")
    with pytest.raises(TypeError, match="not a class"):
        get_scheduler_cls("core_fakes:make_request")


def test_bad_path_is_a_clear_error() -> None:
    with pytest.raises(PluginImportError, match="--scheduler-cls.*no_such_module"):
        get_scheduler_cls("no_such_module:Sched")
    with pytest.raises(PluginImportError, match="has no attribute 'Missing'"):
        get_scheduler_cls("core_fakes:Missing")
    with pytest.raises(ValueError, match="--scheduler-cls"):
        get_scheduler_cls("NoDots")
