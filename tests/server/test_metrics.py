"""``GET /metrics`` of a fresh server, parsed with ``prometheus_client``, matches what was sent."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import Server, start_server, stop_and_check, wait_until


def scrape(server: Server) -> list:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def bounds(samples: list, name: str) -> list[float]:
    """A histogram's finite bucket bounds, in order."""
    return sorted({float(s.labels["le"]) for s in samples if s.name == name + "_bucket" and s.labels["le"] != "+Inf"})


THROUGHPUT_LINE = "prompt throughput"


def test_counters_and_histograms_match_the_requests_sent(tiny_llama: Path, tmp_path: Path) -> None:
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny",
                       env_extra={"FORKLESS_LOG_STATS_INTERVAL": "0.3"})
    try:
        client = srv.client()
        sent = []  # (usage, number of sequences)
        for i, max_tokens in enumerate((5, 6, 7)):
            sent.append((client.completions.create(model="tiny", prompt=f"Metrics {i}", max_tokens=max_tokens,
                                                   temperature=0).usage, 1))
        sent.append((client.completions.create(model="tiny", prompt="Two at once", max_tokens=3, n=2,
                                               temperature=1.0, seed=3).usage, 2))
        chunks = list(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "stream"}], max_tokens=4, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        sent.append((chunks[-1].usage, 1))
        full = client.completions.create(model="tiny", prompt="Stop here", max_tokens=12, temperature=0)
        sent.append((full.usage, 1))
        stop = full.choices[0].text[len(full.choices[0].text) // 2:][:3]
        stopped = client.completions.create(model="tiny", prompt="Stop here", max_tokens=12, temperature=0,
                                            stop=[stop])
        assert stopped.choices[0].finish_reason == "stop"
        sent.append((stopped.usage, 1))

        finished = sum(n for _, n in sent)
        prompt = sum(u.prompt_tokens * n for u, n in sent)  # every sequence of n>1 prefills its prompt
        generated = sum(u.completion_tokens for u, _ in sent)
        # the last request's stats reach the stat loggers just before its response is sent
        wait_until(lambda: value(scrape(srv), "forkless:request_success_total") >= finished, 10)
        m = scrape(srv)
        assert value(m, "forkless:request_success_total", finished_reason="length") == finished - 1
        assert value(m, "forkless:request_success_total", finished_reason="stop") == 1
        assert value(m, "forkless:request_success_total") == finished
        assert value(m, "forkless:prompt_tokens_total") == prompt
        assert value(m, "forkless:generation_tokens_total") == generated
        for name in ("forkless:e2e_request_latency_seconds", "forkless:time_to_first_token_seconds",
                     "forkless:request_prompt_tokens", "forkless:request_generation_tokens"):
            assert value(m, name + "_count") == finished, name
            assert value(m, name + "_bucket", le="+Inf") == finished, name
        assert value(m, "forkless:request_prompt_tokens_sum") == prompt
        # vLLM's bucket bounds, so that a dashboard made for vLLM reads the same quantiles.
        assert bounds(m, "forkless:e2e_request_latency_seconds")[-2:] == [1920.0, 7680.0]
        assert bounds(m, "forkless:time_to_first_token_seconds")[-2:] == [640.0, 2560.0]
        assert bounds(m, "forkless:inter_token_latency_seconds")[:3] == [0.01, 0.025, 0.05]
        max_model_len = client.models.list().data[0].model_extra["max_model_len"]
        tokens = bounds(m, "forkless:request_prompt_tokens")
        assert tokens[:6] == [1.0, 2.0, 5.0, 10.0, 20.0, 50.0] and tokens[-1] <= max_model_len < tokens[-1] * 2.5
        assert value(m, "forkless:request_generation_tokens_sum") == generated
        # vLLM's phases of each finished request, from the engine core's event times.
        phases = ("queue", "prefill", "decode", "inference")
        for phase in phases:
            name = f"forkless:request_{phase}_time_seconds"
            assert value(m, name + "_count") == finished, name
            assert value(m, name + "_bucket", le="+Inf") == finished, name
            assert value(m, name + "_sum") > 0, name
        queue, prefill, decode, inference = (value(m, f"forkless:request_{p}_time_seconds_sum") for p in phases)
        # Inference is prefill then decode, on one clock (the engine core's).
        assert inference >= prefill
        assert abs(inference - (prefill + decode)) < 1e-6
        # No phase outlasts the request as the client saw it.
        assert max(queue, inference) <= value(m, "forkless:e2e_request_latency_seconds_sum")
        # vLLM's: one gap per output after a sequence's first (one token an output here),
        # and every finished request's mean time per output token.
        assert value(m, "forkless:inter_token_latency_seconds_count") == generated - finished
        assert value(m, "forkless:request_time_per_output_token_seconds_count") == finished
        assert value(m, "forkless:request_time_per_output_token_seconds_sum") > 0
        assert wait_until(lambda: value(scrape(srv), "forkless:kv_cache_usage_perc") == 0, 15)
        assert value(scrape(srv), "forkless:num_requests_running") == 0
        # The periodic line (which --disable-log-stats turns off: below), at the first log
        # interval after the requests: on a fast host they all ran within one interval.
        assert wait_until(lambda: THROUGHPUT_LINE in srv.log(), 10)
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_disable_log_stats_keeps_no_statistics_as_vllm(tiny_llama: Path, tmp_path: Path) -> None:
    """vLLM's --disable-log-stats without stat logger plugins: no periodic line and no
    Prometheus series; /metrics still answers (empty), and requests are served."""
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--disable-log-stats",
                       env_extra={"FORKLESS_LOG_STATS_INTERVAL": "0.3"})
    try:
        client = srv.client()
        for i in range(3):
            assert client.completions.create(model="tiny", prompt=f"Quiet {i}", max_tokens=4).usage.completion_tokens
        time.sleep(1.0)  # three log intervals
        response = httpx.get(srv.url + "/metrics", timeout=30)
        assert response.status_code == 200
        assert not [s for s in scrape(srv) if s.name.startswith("forkless:")]
        assert THROUGHPUT_LINE not in srv.log()
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]
