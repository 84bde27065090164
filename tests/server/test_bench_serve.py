"""``forkless bench serve`` against a real tiny server: vLLM's table, its JSON, the rate and the
concurrency limit, vLLM's other flags (backends, the random prefix, goodput, ramp-up, sampling,
headers, request ids, the result file's options) seen where a user sees them (the server's log
and metrics, the table, the JSON), and its flag errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from forkless.bench.serve import arrival_times, length_bounds, random_requests, request_rates, vocab_size_of
from forkless.entrypoints.cli.main import main
from tests.server.conftest import Server, free_port, start_server, wait_until


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # The access log shows which path each request took, --enable-log-requests each
    # request's id and sampling parameters, and /metrics (statistics on) the prefix cache.
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("bench-serve"), "--served-model-name", "tiny",
                       "--uvicorn-log-level", "info", "--enable-log-requests")
    yield srv
    srv.stop()


def posts(srv: Server, path: str) -> int:
    """How many POSTs to ``path`` the server's access log shows."""
    return len(re.findall(rf'"POST {re.escape(path)} HTTP/1.1" 200', srv.log()))


def metric(srv: Server, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


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


def test_random_prefix_is_shared_and_counted() -> None:
    reqs = random_requests(6, 10, 4, 0.5, vocab_size=1000, seed=1, prefix_len=32, request_id_prefix="p-")
    prefix = reqs[0].prompt[:32]
    assert all(r.prompt[:32] == prefix and len(r.prompt) == r.prompt_len for r in reqs)
    assert {r.prompt_len - 32 for r in reqs} <= set(range(5, 16))  # the range ratio spares the prefix
    assert [r.request_id for r in reqs] == [f"p-{i}" for i in range(6)]
    assert len({tuple(r.prompt[32:]) for r in reqs}) == 6
    # No prefix: the same draws as before the flag existed (the lengths, then each prompt).
    with_ids = random_requests(3, 10, 4, seed=2, request_id_prefix="x")
    assert [r.prompt for r in with_ids] == [r.prompt for r in random_requests(3, 10, 4, seed=2)]


def test_ramp_up_rates_and_arrivals() -> None:
    assert request_rates(5, math.inf, ("linear", 2, 10)) == [2, 4, 6, 8, 10]
    assert request_rates(3, math.inf, ("exponential", 1, 16)) == pytest.approx([1, 4, 16])
    # burstiness inf: each gap is exactly 1 / its rate, and a ramp is not rescaled (vLLM's).
    assert arrival_times(3, math.inf, math.inf, ramp_up=("exponential", 1, 16)) == pytest.approx([1, 1.25, 1.3125])
    with pytest.raises(ValueError, match="must be > 0"):
        arrival_times(3, math.inf, ramp_up=("linear", 0, 4))


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
    (["--dataset-path", "sg.json"], "--dataset-path (a vllm bench serve flag) is not supported by forkless bench "
                                    "serve: it reads a dataset file"),
    (["--profile"], "--profile (a vllm bench serve flag) is not supported"),
    (["--backend", "openai-embeddings"], "backend 'openai-embeddings' is vLLM's audio / pooling / rerank"),
    (["--endpoint", "/v1/embeddings"], "--endpoint /v1/embeddings: the openai backend's URL must end with completions"),
    (["--backend", "openai-chat", "--endpoint", "/v1/completions"], "URL must end with chat/completions"),
    (["--random-batch-size", "4"], "--random-batch-size 4: vLLM batches random prompts only for its embedding"),
    (["--goodput", "ttft:10", "itl:5"], "Invalid metric name found, itl: 5"),
    (["--goodput", "ttft"], "Invalid format found for service level objectives"),
    (["--goodput", "e2el:-1"], "Invalid value found, e2el: -1"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "5", "--request-rate", "3"],
     "When using ramp-up, do not specify --request-rate"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"], "both --ramp-up-start-rps and --ramp-up-end-rps"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "1"],
     "Ramp-up start RPS must be less than end RPS"),
    (["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "4"],
     "For exponential ramp-up, the start RPS cannot be 0."),
    (["--ramp-up-strategy", "sawtooth"], "argument --ramp-up-strategy: invalid choice: 'sawtooth'"),
    (["--header", "Authorization"], "argument --header: Invalid header format. Please use KEY=VALUE format"),
    (["--metadata", "tp"], "argument --metadata: Invalid metadata format. Please use KEY=VALUE format"),
    (["--extra-body", "[1]"], "argument --extra-body: must be a JSON object"),
    (["--server-args", "--max-model-len", "64"], "--server-args start a server here; they cannot go with --base-url"),
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


def test_help_lists_the_vllm_flags_it_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "vllm bench serve flags not supported here (each fails, saying why): --dataset-path," in out
    assert "--profile" in out and "--plot-timeline" in out


def test_without_base_url_it_starts_the_server_and_times_it(tiny_llama: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # --served-model-name names the model of the server it starts, as of the requests.
    rc, out = bench(capsys, str(tiny_llama), "--num-prompts", "2", "--random-input-len", "8",
                    "--random-output-len", "3", "--save-result", "--result-dir", str(tmp_path),
                    "--served-model-name", "mine",
                    "--server-args", "--max-model-len", "64", "--kv-cache-memory", str(16 << 20))
    assert rc == 0, out
    assert "start -> /health OK: " in out and "Serving Benchmark Result" in out
    (saved,) = tmp_path.glob("openai-infqps-mine-*.json")  # vLLM's default file name
    res = json.loads(saved.read_text())
    assert res["completed"] == 2 and res["total_output_tokens"] == 6 and res["server_startup_s"] > 0


def test_backends_openai_chat_and_vllm(server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chat, completions, detok = (posts(server, p) for p in ("/v1/chat/completions", "/v1/completions", "/detokenize"))
    rc, out = bench(capsys, "--base-url", server.url, "--backend", "openai-chat", "--num-prompts", "3",
                    "--input-len", "8", "--output-len", "4", "--save-result", "--result-dir", str(tmp_path),
                    "--save-detailed")
    assert rc == 0, out
    # One chat completion a prompt, its text decoded by the server first; no completion.
    assert wait_until(lambda: posts(server, "/v1/chat/completions") == chat + 3)
    assert posts(server, "/detokenize") == detok + 3 and posts(server, "/v1/completions") == completions
    (saved,) = tmp_path.glob("openai-chat-infqps-tiny-*.json")
    res = json.loads(saved.read_text())
    assert res["backend"] == res["endpoint_type"] == "openai-chat" and res["completed"] == 3
    assert res["total_output_tokens"] == 12
    # The prompt tokens are the server's: the chat template's come on top of the 8 drawn.
    assert all(n > 8 for n in res["input_lens"]) and res["total_input_tokens"] == sum(res["input_lens"])

    rc, out = bench(capsys, "--base-url", server.url, "--backend", "vllm", "--num-prompts", "2",
                    "--random-input-len", "8", "--random-output-len", "3", "--save-result", "--result-dir",
                    str(tmp_path))
    assert rc == 0, out
    assert wait_until(lambda: posts(server, "/v1/completions") == completions + 2)
    (saved,) = tmp_path.glob("vllm-infqps-tiny-*.json")  # the label defaults to the backend
    assert json.loads(saved.read_text())["backend"] == "vllm"


def test_random_prefix_len_hits_the_prefix_cache(server: Server, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    hits = "forkless:prefix_cache_hits_total"

    def run(*flags: str) -> float:
        before = metric(server, hits)
        rc, out = bench(capsys, "--base-url", server.url, "--num-prompts", "4", "--random-input-len", "8",
                        "--random-output-len", "2", "--max-concurrency", "1", *flags)
        assert rc == 0, out
        # Counted when the requests were admitted, long before their last tokens.
        return metric(server, hits) - before

    # Four 8-token prompts (shorter than a block) share nothing; with a 64-token prefix the
    # last three find its blocks in the cache.
    assert run("--seed", "101") == 0
    assert run("--seed", "102", "--random-prefix-len", "64", "--save-result", "--result-dir", str(tmp_path),
               "--result-filename", "p.json") >= 3 * 48
    assert json.loads((tmp_path / "p.json").read_text())["total_input_tokens"] == 4 * (64 + 8)


def test_goodput(server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--base-url", server.url, "--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "3",
              "--save-result", "--result-dir", str(tmp_path)]
    rc, out = bench(capsys, *common, "--goodput", "ttft:60000", "tpot:60000", "e2el:60000",
                    "--result-filename", "all.json")
    assert rc == 0, out
    res = json.loads((tmp_path / "all.json").read_text())
    assert res["request_goodput"] == pytest.approx(res["request_throughput"])  # every request met the SLOs
    assert "{:<40} {:<10.2f}".format("Request goodput (req/s):", res["request_goodput"]) in out
    rc, out = bench(capsys, *common, "--goodput", "ttft:0", "--result-filename", "none.json")
    assert rc == 0, out
    assert json.loads((tmp_path / "none.json").read_text())["request_goodput"] == 0.0
    rc, out = bench(capsys, *common, "--result-filename", "unset.json")
    assert json.loads((tmp_path / "unset.json").read_text())["request_goodput"] is None
    assert "Request goodput" not in out


def test_ramp_up_sends_faster_and_faster(server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = bench(capsys, "--base-url", server.url, "--num-prompts", "4", "--random-input-len", "8",
                    "--random-output-len", "2", "--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "1",
                    "--ramp-up-end-rps", "64", "--burstiness", "inf", "--save-result", "--save-detailed",
                    "--result-dir", str(tmp_path))
    assert rc == 0, out
    assert "Traffic ramp-up strategy: exponential.\nWill increase RPS from 1 to 64 RPS" in out
    (saved,) = tmp_path.glob("openai-ramp-up-exponential-1qps-64qps-tiny-*.json")  # vLLM's name for a ramp
    res = json.loads(saved.read_text())
    assert (res["ramp_up_strategy"], res["ramp_up_start_rps"], res["ramp_up_end_rps"]) == ("exponential", 1, 64)
    assert [e["rps"] for e in res["rps_change_events"]] == list(range(1, 65))
    # Rates 1, 4, 16, 64: the requests go out 0.25, 0.0625 and 0.016 s apart.
    starts = res["start_times"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[0] > 0.2 and gaps[0] > 3 * gaps[2], gaps
    assert 1.2 < res["duration"] < 10


def test_sampling_flags_request_ids_and_extra_body_reach_the_server(server: Server,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = bench(capsys, "--base-url", server.url, "--num-prompts", "2", "--random-input-len", "8",
                    "--random-output-len", "2", "--request-id-prefix", "sampled-", "--top-p", "0.5", "--top-k", "3",
                    "--min-p", "0.25", "--logprobs", "2", "--extra-body", '{"seed": 77}')
    assert rc == 0, out
    lines = wait_until(lambda: [ln for ln in server.log().splitlines() if "request cmpl-sampled-" in ln])
    assert sorted(re.search(r"cmpl-sampled-(\d+)-", ln).group(1) for ln in lines) == ["0", "1"]
    for text in ("top_p=0.5", "top_k=3", "min_p=0.25", "logprobs=2", "seed=77", "ignore_eos=True"):
        assert all(text in ln for ln in lines), (text, lines)
    rc, out = bench(capsys, "--base-url", server.url, "--num-prompts", "1", "--random-input-len", "8",
                    "--random-output-len", "2", "--request-id-prefix", "unsampled-")
    assert rc == 0, out
    (line,) = wait_until(lambda: [ln for ln in server.log().splitlines() if "request cmpl-unsampled-0-" in ln])
    assert "top_k=3" not in line and "logprobs=None" in line  # sent only when given


def test_save_detailed_append_metadata_and_progress_bar(server: Server, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--base-url", server.url, "--num-prompts", "3", "--random-input-len", "8", "--random-output-len", "3",
              "--result-dir", str(tmp_path), "--result-filename", "runs.json", "--append-result"]
    assert main(["bench", "serve", *common, "--metadata", "version=1.2", "tp=2"]) == 0
    first = capsys.readouterr()
    assert "3/3" in first.err  # tqdm's bar, on stderr
    assert main(["bench", "serve", *common, "--save-detailed", "--disable-tqdm"]) == 0
    assert "3/3" not in capsys.readouterr().err
    lines = (tmp_path / "runs.json").read_text().splitlines()
    assert len(lines) == 2  # appended: one result a line
    plain, detailed = map(json.loads, lines)
    assert (plain["version"], plain["tp"]) == ("1.2", "2") and "version" not in detailed
    assert not set(plain) & {"ttfts", "itls", "generated_texts", "errors", "input_lens", "output_lens", "start_times"}
    assert len(plain["latencies"]) == 3  # kept in every result, as vLLM's
    assert detailed["output_lens"] == [3, 3, 3] and detailed["errors"] == ["", "", ""]
    # One gap per text-carrying chunk after the first: at most 2 for 3 tokens, fewer where
    # tokens share a chunk (a sampled token's text held back, part of a character, comes with
    # the next; a stream that fell behind gets its missed steps merged, _OutputSlot); the
    # first chunk's time plus the gaps is the request's latency.
    for itl, ttft, latency in zip(detailed["itls"], detailed["ttfts"], detailed["latencies"], strict=True):
        assert len(itl) <= 2 and ttft > 0 and all(gap >= 0 for gap in itl), (itl, ttft)
        assert ttft + sum(itl) == pytest.approx(latency, abs=1e-6), (itl, ttft, latency)
    assert all(isinstance(t, str) and t for t in detailed["generated_texts"])
    assert detailed["input_lens"] == [8, 8, 8] and len(detailed["start_times"]) == 3


def test_client_queue_metrics_under_a_concurrency_limit(server: Server, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = bench(capsys, "--base-url", server.url, "--num-prompts", "4", "--random-input-len", "8",
                    "--random-output-len", "3", "--max-concurrency", "1", "--request-rate", "100",
                    "--percentile-metrics", "ttft,client_queue_time,e2el_including_client_queue",
                    "--save-result", "--result-dir", str(tmp_path), "--result-filename", "q.json")
    assert rc == 0, out
    assert "Client-side Queueing" in out and "Mean E2EL incl. Client Queue (ms):" in out
    res = json.loads((tmp_path / "q.json").read_text())
    # One at a time, all due within 40 ms: the last waited for the three before it.
    assert max(res["queue_times"]) > 0 and res["p99_client_queue_time_ms"] > 0
    assert res["mean_e2el_including_client_queue_ms"] > res["mean_ttft_ms"]


def test_model_names_served_model_name_and_lora_modules(server: Server, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--base-url", server.url, "--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "2",
              "--save-result", "--result-dir", str(tmp_path)]
    # --model names the run (its file and model_id); --served-model-name is what is asked for.
    rc, out = bench(capsys, *common, "--model", "org/my-model", "--served-model-name", "tiny")
    assert rc == 0, out
    (saved,) = tmp_path.glob("openai-infqps-my-model-*.json")
    assert json.loads(saved.read_text())["model_id"] == "org/my-model"
    rc, out = bench(capsys, *common, "--lora-modules", "adapter-a", "adapter-b", "--lora-assignment",
                    "round-robin", "--save-detailed", "--result-filename", "lora.json")
    assert rc == 1  # no such adapters: each request named one of them, in turn
    errors = json.loads((tmp_path / "lora.json").read_text())["errors"]
    assert "adapter-a" in errors[0] and "adapter-b" in errors[1], errors


def test_ready_check(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = bench(capsys, "--base-url", server.url, "--num-prompts", "1", "--random-input-len", "8",
                    "--random-output-len", "2", "--ready-check-timeout-sec", "30")
    assert rc == 0, out
    assert "Starting initial single prompt test run...\nInitial test run completed." in out
    with pytest.raises(SystemExit, match="initial test run failed"):
        main(["bench", "serve", "--port", str(free_port()), "--model", "tiny", "--num-prompts", "1",
              "--ready-check-timeout-sec", "1"])


def test_host_port_and_headers_reach_a_server_with_an_api_key(tiny_llama: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "locked", api_key="s3cret")
    try:
        common = ["--host", "127.0.0.1", "--port", str(srv.port), "--num-prompts", "2", "--random-input-len", "8",
                  "--random-output-len", "2"]
        rc, out = bench(capsys, *common, "--header", "Authorization=Bearer s3cret", "x-extra=1")
        assert rc == 0, out
        assert "Successful requests:" in out and "start -> /health" not in out  # no server of its own
        with pytest.raises(SystemExit, match="401"):  # the model list is asked with the headers too
            main(["bench", "serve", *common])
        rc, out = bench(capsys, *common, "--model", "locked")
        assert rc == 1 and "HTTP 401" in out
        monkeypatch.setenv("OPENAI_API_KEY", "s3cret")  # vLLM's client reads it
        rc, out = bench(capsys, *common)
        assert rc == 0, out
    finally:
        srv.stop()
