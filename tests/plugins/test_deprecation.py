"""The deprecation helper: one mechanism, three stages, four kinds of names."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from forkless.plugins import DeprecatedError, Deprecation, DeprecationKind, DeprecationRegistry


@pytest.fixture()
def warnings_seen(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("forkless")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="forkless")
    yield lambda: [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    logger.removeHandler(caplog.handler)


def make(stage: int) -> DeprecationRegistry:
    reg = DeprecationRegistry()
    reg.add(Deprecation(DeprecationKind.CLI_FLAG, "--max-seq-len", "--max-model-len", "0.1", "0.3", stage))
    reg.add(Deprecation(DeprecationKind.ENV_VAR, "FORKLESS_OLD_CACHE", "FORKLESS_CACHE_ROOT", "0.1", "0.3", stage))
    reg.add(Deprecation(DeprecationKind.HTTP_FIELD, "best_of", "n", "0.1", "0.3", stage))
    return reg


def test_stage1_warns_once_and_still_works(warnings_seen) -> None:
    reg = make(1)
    reg.check_cli_args(["--max-seq-len=10", "--max-seq-len", "5", "--port", "8000"])
    reg.check_environ({"FORKLESS_OLD_CACHE": "/x"})
    reg.check_http_fields("/v1/completions", {"best_of": 2, "model": "m"})
    seen = warnings_seen()
    assert len(seen) == 3
    assert "--max-seq-len is deprecated since forkless 0.1 and will be removed in 0.3; use --max-model-len instead" in seen[0]
    assert "environment variable FORKLESS_OLD_CACHE" in seen[1]
    assert "HTTP request field best_of" in seen[2] and "use n instead" in seen[2]


def test_stage2_errors_unless_reenabled(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = make(2)
    with pytest.raises(DeprecatedError, match="FORKLESS_ALLOW_DEPRECATED=--max-seq-len"):
        reg.check_cli_args(["--max-seq-len", "5"])
    monkeypatch.setenv("FORKLESS_ALLOW_DEPRECATED", "--max-seq-len, best_of")
    reg.check_cli_args(["--max-seq-len", "5"])
    reg.check_http_fields("/v1/completions", {"best_of": 2})
    with pytest.raises(DeprecatedError):
        reg.check_environ({"FORKLESS_OLD_CACHE": "1"})


def test_stage3_is_a_clear_error_naming_the_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = make(3)
    monkeypatch.setenv("FORKLESS_ALLOW_DEPRECATED", "--max-seq-len")  # cannot revive removed names
    with pytest.raises(DeprecatedError, match=r"^CLI flag --max-seq-len was removed in forkless 0.3; use --max-model-len instead$"):
        reg.check_cli_args(["--max-seq-len=5"])
    with pytest.raises(DeprecatedError, match="HTTP request field best_of was removed"):
        reg.check_http_fields("/v1/completions", {"best_of": 1})


def test_python_api_decorator(warnings_seen) -> None:
    reg = DeprecationRegistry()

    @reg.python_api("new_generate()", "0.1", "0.3", name="old_generate")
    def old_generate(x: int) -> int:
        return x + 1

    assert old_generate(1) == 2 and old_generate(2) == 3
    assert warnings_seen() == ["Python API old_generate is deprecated since forkless 0.1 and will be removed in 0.3; use new_generate() instead"]

    @reg.python_api("new_thing()", "0.1", "0.2", stage=3, name="gone")
    def gone() -> None:
        raise AssertionError("never runs")

    with pytest.raises(DeprecatedError, match="Python API gone was removed in forkless 0.2; use new_thing"):
        gone()


def test_bad_stage_rejected() -> None:
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3"):
        Deprecation(DeprecationKind.ENV_VAR, "X", None, "0.1", "0.2", stage=4)


def test_a_removed_forkless_variable_stops_the_cli_naming_it() -> None:
    env = dict(os.environ, FORKLESS_DECODE_OVERLAP_MIN_BATCH="256")
    proc = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "--help"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "environment variable FORKLESS_DECODE_OVERLAP_MIN_BATCH was removed in forkless 0.1.0" in proc.stderr
