"""Selecting logits processors: --logits-processors paths, entry points, validation."""

import logging

import pytest
import torch

import forkless.plugins
from forkless import SamplingParams
from forkless.logits_processors import (
    BUILTIN_LOGITS_PROCESSORS,
    LogitsProcessor,
    build_logits_processors,
    load_custom_classes,
    validate_request_params,
)
from forkless.plugins import PluginImportError, PluginLoadError
from sample_force_token import ForceTokenLogitsProcessor

CPU = torch.device("cpu")
FORCE = "sample_force_token:ForceTokenLogitsProcessor"


def _names(procs):
    return [type(p).__name__ for p in procs]


def test_builtins_then_custom_in_order_without_duplicates():
    procs = build_logits_processors(
        None, CPU, False, [FORCE, "sample_force_token.ForceTokenLogitsProcessor"],
        entry_points=False,
    )
    assert _names(procs) == [
        "MinTokensLogitsProcessor", "LogitBiasLogitsProcessor", "MinPLogitsProcessor",
        "AllowedTokenIdsLogitsProcessor", "BadWordsLogitsProcessor", "ThinkingTokenBudgetLogitsProcessor",
        "ForceTokenLogitsProcessor",
    ]
    assert len(BUILTIN_LOGITS_PROCESSORS) == 6
    assert all(p.device == CPU for p in procs)


def test_comma_separated_flag_value_and_classes_are_accepted():
    assert load_custom_classes(f"{FORCE}, {FORCE}", entry_points=False) == [ForceTokenLogitsProcessor]
    assert load_custom_classes([ForceTokenLogitsProcessor], entry_points=False) == [
        ForceTokenLogitsProcessor
    ]


@pytest.mark.parametrize(
    ("value", "error", "needle"),
    [
        ("no_such_module_xyz:Proc", PluginImportError, "no_such_module_xyz"),
        ("sample_force_token:Missing", PluginImportError, "has no attribute 'Missing'"),
        ("sample_force_token:NotAProcessor", TypeError, "not a subclass of"),
        ("justaname", ValueError, "class path"),
        (42, TypeError, "not a class"),
    ],
)
def test_bad_logits_processor_values_are_clear_errors(value, error, needle):
    with pytest.raises(error) as info:
        build_logits_processors(None, CPU, False, [value], entry_points=False)
    message = str(info.value)
    assert needle in message
    assert "--logits-processors" in message
    if error is TypeError and value != 42:
        assert "LogitsProcessor" in message


def test_validate_request_params_runs_custom_validators_and_vocab_checks():
    classes = load_custom_classes([FORCE], entry_points=False)
    validate_request_params(SamplingParams(extra_args={"force_token": 3}), classes, vocab_size=10)
    with pytest.raises(ValueError, match="force_token='x'"):
        validate_request_params(SamplingParams(extra_args={"force_token": "x"}), classes)
    with pytest.raises(ValueError, match=r"logit_bias has token ids \[12\]"):
        validate_request_params(SamplingParams(logit_bias={12: 1.0}), classes, vocab_size=10)
    with pytest.raises(ValueError, match=r"stop_token_ids has token ids \[10\]"):
        validate_request_params(SamplingParams(stop_token_ids=[10]), [], vocab_size=10)


def _fake_group(monkeypatch, plugins):
    def load(group):
        assert group == "forkless.logits_processors"
        return plugins

    monkeypatch.setattr(forkless.plugins, "load_plugins_by_group", load)


def test_entry_point_processors_are_loaded_after_flag_ones(monkeypatch):
    class FromPlugin(ForceTokenLogitsProcessor):
        pass

    _fake_group(monkeypatch, {"a_plugin": FromPlugin, "b_dup": ForceTokenLogitsProcessor})
    procs = build_logits_processors(None, CPU, False, [FORCE])
    assert _names(procs)[len(BUILTIN_LOGITS_PROCESSORS):] == ["ForceTokenLogitsProcessor", "FromPlugin"]


def test_entry_point_that_is_not_a_processor_is_skipped_or_fatal_in_strict_mode(
    monkeypatch, caplog
):
    _fake_group(monkeypatch, {"broken": dict})
    monkeypatch.delenv("FORKLESS_PLUGINS_STRICT", raising=False)
    with caplog.at_level(logging.WARNING, logger="forkless.logits_processors"):
        assert load_custom_classes() == []
    assert "'broken'" in caplog.text and "LogitsProcessor" in caplog.text
    monkeypatch.setenv("FORKLESS_PLUGINS_STRICT", "1")
    with pytest.raises(PluginLoadError, match="'broken'"):
        load_custom_classes()


def test_real_entry_point_group_loads_when_nothing_is_installed(monkeypatch):
    monkeypatch.setenv("FORKLESS_PLUGINS", "")
    assert load_custom_classes() == []


def test_interface_is_provisional_and_importable_without_torch_types():
    from forkless.plugins import Stability, tier_of

    assert tier_of(LogitsProcessor) is Stability.PROVISIONAL
