"""What a user sees when installing and starting forkless: no warnings, early errors, a
log line per phase.

Every test runs real processes: the build backend on ``pyproject.toml``, and
``forkless serve`` on a loopback port.
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from tests.conftest import plugin_env
from tests.server.conftest import free_port

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------ packaging


def test_building_the_metadata_prints_no_deprecation_warning(tmp_path: Path) -> None:
    """The build backend accepts pyproject.toml as written (PEP 639 licence string)."""
    import setuptools

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    backend = next(Requirement(r) for r in requires if Requirement(r).name == "setuptools")
    assert backend.specifier.contains(setuptools.__version__), (
        f"the venv's setuptools {setuptools.__version__} does not satisfy {backend}")
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "deprecat" not in (proc.stdout + proc.stderr).lower(), proc.stderr[-3000:]
    metadata = next(tmp_path.glob("*.dist-info/METADATA")).read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


# ------------------------------------------------------- bad class paths fail at once


def forkless_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``forkless ARGS``; the finished process and how long it ran."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


BAD_CLASS_PATHS = [
    (["--logits-processors", "nosuch.mod:X"],
     "error: --logits-processors: cannot import 'nosuch.mod:X': importing module 'nosuch.mod' failed: "
     "ModuleNotFoundError: No module named 'nosuch'; expected a subclass of "
     "forkless.logits_processors.interface.LogitsProcessor"),
    (["--logits-processors", "forkless.logits_processors.min_p:MinPLogitsProcessor,collections:OrderedDict"],
     "error: --logits-processors: collections.OrderedDict is not a subclass of "
     "forkless.logits_processors.interface.LogitsProcessor"),
    (["--scheduler-cls", "collections:OrderedDict"],
     "error: --scheduler-cls: collections.OrderedDict is not a subclass of "
     "forkless.core.sched.interface.SchedulerInterface"),
    (["--distributed-executor-backend", "nonsense"],
     "error: --distributed-executor-backend='nonsense' is invalid: expected one of mp, ray, uni or an Executor"),
    (["--distributed-executor-backend", "collections:OrderedDict"],
     "error: --distributed-executor-backend: collections.OrderedDict is not a subclass of "
     "forkless.executor.interface.Executor"),
]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], elapsed: float, expected: str,
                          cache_root: Path) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 3, proc.stderr
    # Before the model was even resolved: the default model's GGUF was not expanded.
    assert not (cache_root / "models").exists()
    assert elapsed < 20, f"took {elapsed:.1f} s"  # ~1 s; generous for a loaded machine


@pytest.mark.parametrize(("flags", "expected"), BAD_CLASS_PATHS)
def test_serve_rejects_a_bad_class_path_at_once(tmp_path: Path, flags: list[str], expected: str) -> None:
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="")
    proc, elapsed = forkless_cli(["serve", "--port", str(free_port()), *flags], env)
    assert_one_line_error(proc, elapsed, expected, tmp_path / "cache")


@pytest.mark.parametrize(("flags", "expected"), BAD_CLASS_PATHS[::2])
def test_generate_rejects_a_bad_class_path_at_once(tmp_path: Path, flags: list[str], expected: str) -> None:
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="")
    proc, elapsed = forkless_cli(["generate", "--prompt", "hi", *flags], env)
    assert proc.stdout == ""
    assert_one_line_error(proc, elapsed, expected, tmp_path / "cache")


def test_a_plugin_that_points_a_backend_at_a_missing_module_is_named_at_once(tmp_path: Path) -> None:
    # It replaced a built-in's path: the start fails before any engine process, naming
    # the plugin (each worker failed on it, with tracebacks and the --attention-backend
    # flag the user never gave).
    from tests.plugins.test_cli import fake_plugin

    site = tmp_path / "site"
    fake_plugin(site, "backend_swap", "def register():\n"
                "    from forkless.attention import register_attention_backend\n"
                "    register_attention_backend('cpu', 'no_such_pkg.attn:Backend')\n")
    env = plugin_env(site, tmp_path)
    proc, elapsed = forkless_cli(["serve", "--port", str(free_port()), "--attention-backend", "cpu"], env)
    assert_one_line_error(proc, elapsed, "error: attention backend 'cpu' -> 'no_such_pkg.attn:Backend' (registered "
                          "by plugin 'backend_swap' of forkless.general_plugins): module 'no_such_pkg.attn' cannot "
                          "be found", tmp_path / "cache")
    assert "now replaced by no_such_pkg.attn:Backend, by plugin 'backend_swap' of forkless.general_plugins" \
        in proc.stderr


PLUGIN = '''
def register() -> None:
    from forkless.executor import register_executor

    register_executor("h_startup_exec", "forkless.executor.uniproc:UniProcExecutor")
'''


def test_names_registered_by_general_plugins_pass_the_check(tmp_path: Path) -> None:
    """General plugins load before the check: an executor name one registers is accepted
    (the server then stops at the next check, a bad --middleware)."""
    site = tmp_path / "site"
    (site / "h_startup_plugin").mkdir(parents=True)
    (site / "h_startup_plugin" / "__init__.py").write_text(PLUGIN)
    dist = site / "h_startup_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: h-startup-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[forkless.general_plugins]\nh_startup = h_startup_plugin:register\n")
    env = plugin_env(site, tmp_path, FORKLESS_PLUGINS="h_startup")
    proc, elapsed = forkless_cli(["serve", "--port", str(free_port()), "--distributed-executor-backend",
                                  "h_startup_exec", "--middleware", "nosuch_mw:M"], env)
    assert_one_line_error(proc, elapsed, "error: --middleware 'nosuch_mw:M': cannot import", tmp_path / "cache")


# ------------------------------------------------------------ a log line per phase


@dataclass
class TimedLines:
    """A process's output lines, each with the ``time.monotonic()`` it arrived at."""

    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def find(self, pattern: str) -> list[int]:
        return [i for i, (_, line) in enumerate(self.lines) if re.search(pattern, line)]


def serve_until_ready(model: Path, tmp_path: Path, timeout: float = 300) -> TimedLines:
    """Start ``forkless serve MODEL`` in a fresh cache root, collect its log until the
    ready line, then stop it (SIGTERM) and check that it exits cleanly."""
    port = free_port()
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="")
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(model), "--port", str(port),
           "--max-model-len", "256", "--kv-cache-memory", str(64 << 20), "--max-num-seqs", "8"]
    out = TimedLines(time.monotonic())
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not out.find(r"forkless\.serve: ready in "):
            assert proc.poll() is None, f"server exited with {proc.returncode}:\n{out.text()[-5000:]}"
            assert time.monotonic() < deadline, f"not ready in {timeout} s:\n{out.text()[-5000:]}"
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        reader.join(10)
    assert proc.returncode == 0, out.text()[-5000:]
    return out


# In this order, each exactly once (a GGUF file as MODEL: its expansion is part of the start).
PHASES = [
    r"forkless\.serve: forkless \S+ serve: model \S+tiny\.gguf, starting$",
    r"expanding the GGUF file \S+tiny\.gguf into a float32 model folder under \S+ \(once per file\)",
    r"expanded \S+tiny\.gguf in [\d.]+ s: ",
    r"started the engine core process \(pid \d+\)",
    r"started worker process 0 \(pid \d+\)",
    r"loaded the model weights in [\d.]+ s: LlamaForCausalLM",
    r"forkless\.cpu_kernels: CPU kernels: ISA \S+ \(",  # after compiling them or loading them from the cache
    r"KV cache: \d+ blocks of 16 tokens",
    r"forkless\.serve: ready in [\d.]+ s: serving \S+ on http://127\.0\.0\.1:\d+ \(OpenAI API at /v1\)$",
]


def test_serve_logs_its_first_line_at_once_then_one_line_per_phase(tmp_path: Path) -> None:
    from tests.model_loader.tiny_gguf import write_tiny_llama_gguf

    model = write_tiny_llama_gguf(tmp_path / "src" / "tiny.gguf").path
    out = serve_until_ready(model, tmp_path / "run")
    first_at, first = out.lines[0]
    assert re.search(PHASES[0], first), out.text()
    # Right after argument parsing, before torch or transformers are imported: ~0.4 s
    # (bounded generously: the machine running the tests is shared).
    assert first_at - out.started < 3, f"first line after {first_at - out.started:.1f} s"
    positions = []
    for pattern in PHASES:
        found = out.find(pattern)
        assert len(found) == 1, f"{pattern!r} found {len(found)} times in:\n{out.text()}"
        positions += found
    assert positions == sorted(positions), out.text()
    # The tokenizer loads in the API server while the engine core starts: after the
    # engine core was started, before the server is ready.
    tokenizer = out.find(r"loaded the tokenizer in [\d.]+ s: ")
    assert len(tokenizer) == 1 and positions[3] < tokenizer[0] < positions[-1], out.text()


def test_default_model_expansion_is_announced_on_first_start_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from forkless.model_loader import default_model
    from tests.model_loader.tiny_gguf import write_tiny_llama_gguf

    tiny = write_tiny_llama_gguf(tmp_path / "src" / "tiny.gguf").path
    monkeypatch.setattr(default_model, "default_gguf_path", lambda: tiny)
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger="forkless.model_loader")
    logging.getLogger("forkless").addHandler(caplog.handler)  # forkless does not propagate
    try:
        folder = default_model.default_model_path()
        messages = [r.getMessage() for r in caplog.records]
        assert messages[0] == (f"expanding the default model's GGUF into a ~0.5 GB float32 cache under "
                               f"{tmp_path / 'cache' / 'models'} (first start only)...")
        assert re.fullmatch(rf"expanded the default model in [\d.]+ s: {re.escape(str(folder))}", messages[1])
        caplog.clear()
        assert default_model.default_model_path() == folder
        assert caplog.records == []  # reused silently
    finally:
        logging.getLogger("forkless").removeHandler(caplog.handler)


def test_serve_turns_the_collector_back_on_when_it_returns() -> None:
    """`forkless serve` builds with the cyclic collector off; a caller of main() gets it back."""
    import gc

    from forkless.entrypoints.cli.main import main

    assert gc.isenabled()
    assert main(["serve", "--port", "0", "--api-server-count", "2"]) == 2  # a usage error
    assert gc.isenabled()


def test_vllm_server_flags_forkless_does_not_implement_are_refused_saying_why(capsys) -> None:
    from forkless.entrypoints.cli.main import main

    for argv, reason in ((["--uds", "/tmp/x.sock"], "Unix domain socket"),
                         (["--disable-frontend-multiprocessing"], "own process"),
                         (["--download-dir", "/tmp"], "nothing is downloaded"),
                         (["--hf-overrides", '{"a": 1}'], "config.json")):
        assert main(["serve", "--port", "0", *argv]) == 2
        err = capsys.readouterr().err
        assert f"forkless serve: error: {argv[0]}: " in err and reason in err, err


@pytest.mark.parametrize(("argv", "expected"), [
    (["generate", "/nonexistent-model", "--prompt", "hi"], "is not a local folder or file"),
    (["generate", "--prompt", "hi", "--tokenizer", "/nonexistent-tokenizer"], "--tokenizer '/nonexistent-tokenizer'"),
    (["bench", "latency", "--model", "/nonexistent-model"], "is not a local folder or file"),
    (["serve", "--port", "0", "--max-loras", "2"], "--max-loras needs --enable-lora"),
    (["generate", "--prompt", "hi", "--served-model-name", "x"], "--served-model-name has no use here"),
    (["generate", "--prompt", "hi", "--enable-lora"], "--enable-lora has no use here"),
])
def test_bad_command_lines_are_one_line_errors_at_once(tmp_path: Path, argv: list[str], expected: str) -> None:
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="")
    proc, elapsed = forkless_cli(argv, env)
    assert_one_line_error(proc, elapsed, expected, tmp_path / "cache")


@pytest.mark.parametrize(("argv", "expected"), [
    (["serve", "--port", "99999"], "argument --port: expected a port number in 0-65535, got '99999'"),
    (["disagg-proxy", "--prefill", "http://a", "--decode", "http://b", "--port", "-1"], "0-65535, got '-1'"),
    (["bench", "throughput", "--num-prompts", "0"], "--num-prompts: expected a whole number >= 1, got '0'"),
    (["bench", "latency", "--output-len", "0"], "--output-len: expected a whole number >= 1, got '0'"),
    (["generate", "--prompt", "hi", "--config", "any.yaml"], "unrecognized arguments: --config"),  # serve's alone
])
def test_bad_flag_values_are_argparse_errors(tmp_path: Path, argv: list[str], expected: str) -> None:
    # (argparse's usage, then its error line; not a traceback once the work has started.)
    proc, elapsed = forkless_cli(argv, plugin_env(None, tmp_path, FORKLESS_PLUGINS=""))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert expected in proc.stderr.splitlines()[-1] and elapsed < 20, proc.stderr[-500:]


def test_a_malformed_config_json_is_named(tmp_path: Path) -> None:
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="")
    proc, elapsed = forkless_cli(["serve", str(model), "--port", "0"], env)
    assert_one_line_error(proc, elapsed, f"{model / 'config.json'} is not valid JSON", tmp_path / "cache")
