"""``forkless bench serve`` against a real tiny server: vLLM's table, its JSON, the rate and the
concurrency limit, and its flag errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

import pytest

from forkless.bench.serve import arrival_times, length_bounds, random_requests, vocab_size_of
from forkless.entrypoints.cli.main import main
from tests.server.conftest import Server, start_server


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("bench-serve"), "--served-model-name", "tiny",
                       "--disable-log-stats")
    yield srv
    srv.stop()


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["bench", "serve", *args])
    return rc, capsys.readouterr().out


def test_lengths_follow_vllm_range_ratio() -> None:
    assert length_bounds(10, 0.5) == (5, 15)
    assert length_bounds(7, 0.3) == (4, 10)  # floor(4.9), ceil(9.1)
    assert length_bounds(1, 0.9, at_least=1) == (1, 2)
    reqs = random_requests(200, 10, 4, 0.5, vocab_size=1000, seed=1)
    assert {r.prompt_len for r in reqs} == set(range(5, 16))
    assert {r.expected_output_len for r in reqs} == set(range(2, 7))
    assert all(len(r.prompt) == r.prompt_len and 100 <= min(r.prompt) and max(r.prompt) < 1000 for r in reqs)
    assert {r.prompt_len for r in random_requests(5, 10, 4, 0.0, seed=1)} == {10}
    assert random_requests(5, 10, 4, 0.5, seed=3) == random_requests(5, 10, 4, 0.5, seed=3)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        length_bounds(10, 1.0)


def test_arrivals() -> None:
    assert arrival_times(4, math.inf) == [0.0] * 4
    times = arrival_times(50, 10.0, seed=2)
    assert times == sorted(times) and times[-1] == pytest.approx(5.0)  # n / rate, as vLLM scales them
    assert arrival_times(3, 2.0, burstiness=math.inf) == pytest.approx([0.5, 1.0, 1.5])


def test_table_and_json_count_what_was_asked(server: Server, tiny_llama: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = bench(capsys, "--base-url", server.url, "--tokenizer", str(tiny_llama), "--dataset-name", "random",
                    "--num-prompts", "5", "--random-input-len", "16", "--random-output-len", "6",
                    "--random-range-ratio", "0.5", "--ignore-eos", "--seed", "7",
                    "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                    "--save-result", "--result-dir", str(tmp_path / "res"), "--result-filename", "r.json")
    assert rc == 0, out
    for line in ("============ Serving Benchmark Result ============", "Successful requests:",
                 "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
                 "Request throughput (req/s):", "Output token throughput (tok/s):",
                 "Total Token throughput (tok/s):", "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):",
                 "P50 E2EL (ms):", "-----Time per Output Token (excl. 1st token)-----"):
        assert line in out, line
    res = json.loads((tmp_path / "res" / "r.json").read_text())
    asked = random_requests(5, 16, 6, 0.5, vocab_size_of(str(tiny_llama)), seed=7)
    assert res["completed"] == res["num_prompts"] == 5 and res["failed"] == 0
    assert res["total_output_tokens"] == sum(r.expected_output_len for r in asked)
    assert res["total_input_tokens"] == sum(r.prompt_len for r in asked)
    assert res["model_id"] == "tiny" and res["request_rate"] == "inf" and res["max_concurrency"] is None
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "duration"):
        assert res[key] > 0, key
    assert res["output_throughput"] == pytest.approx(res["total_output_tokens"] / res["duration"])
    assert "{:<40} {:<10}".format("Total generated tokens:", res["total_output_tokens"]) in out


def test_finite_rate_and_max_concurrency(server: Server, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    common = ["--base-url", server.url + "/v1", "--num-prompts", "6", "--random-input-len", "8",
              "--random-output-len", "6", "--save-result", "--result-dir", str(tmp_path)]
    rc, out = bench(capsys, *common, "--request-rate", "20", "--result-filename", "rate.json")
    assert rc == 0, out
    assert "{:<40} {:<10.2f}".format("Request rate configured (RPS):", 20.0) in out
    assert json.loads((tmp_path / "rate.json").read_text())["request_rate"] == 20.0

    rc, out = bench(capsys, *common, "--max-concurrency", "2", "--result-filename", "two.json")
    assert rc == 0, out
    assert "{:<40} {:<10}".format("Maximum request concurrency:", 2) in out
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["completed"] == 6 and 1 <= two["max_concurrent_requests"] <= 2

    rc, out = bench(capsys, *common, "--result-filename", "all.json")  # inf rate, no limit: all at once
    assert rc == 0, out
    assert json.loads((tmp_path / "all.json").read_text())["max_concurrent_requests"] > 2


@pytest.mark.parametrize(("flags", "message"), [
    (["--dataset-name", "sharegpt"], "unknown dataset 'sharegpt'; forkless bench serve has: random"),
    (["--request-rate", "-1"], "argument --request-rate: must be > 0 requests/s (or inf for all at once)"),
    (["--request-rate", "0"], "argument --request-rate: must be > 0"),
    (["--random-range-ratio", "1.5"], "argument --random-range-ratio: must be in [0, 1)"),
    (["--max-concurrency", "0"], "argument --max-concurrency: must be > 0"),
    (["--percentile-metrics", "ttft,foo"], "unknown metric(s) foo"),
])
def test_bad_flags_fail_clearly(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "serve", "--base-url", "http://127.0.0.1:9", *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_without_base_url_it_starts_the_server_and_times_it(tiny_llama: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = bench(capsys, str(tiny_llama), "--num-prompts", "2", "--random-input-len", "8",
                    "--random-output-len", "3", "--save-result", "--result-dir", str(tmp_path),
                    "--server-args", "--max-model-len", "64", "--kv-cache-memory", str(16 << 20),
                    "--served-model-name", "mine")
    assert rc == 0, out
    assert "start -> /health OK: " in out and "Serving Benchmark Result" in out
    (saved,) = tmp_path.glob("openai-infqps-mine-*.json")  # vLLM's default file name
    res = json.loads(saved.read_text())
    assert res["completed"] == 2 and res["total_output_tokens"] == 6 and res["server_startup_s"] > 0
