"""The Prometheus stat logger, served at ``/metrics`` (metric names prefixed ``forkless:``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from forkless.metrics.interface import StatLoggerBase
from forkless.protocol.kv_transfer import KVTransferStats
from forkless.protocol.step import SpecDecodeStats

if TYPE_CHECKING:
    from forkless.metrics.stats import IterationStats
    from forkless.protocol.step import SchedulerStats

# vLLM's buckets, so that a dashboard made for vLLM reads the same quantiles here.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
# A whole request and its phases (queue, prefill, decode, inference).
_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                          120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _one_two_five_buckets(largest: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``largest``."""
    buckets: list[float] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale > largest:
                return tuple(buckets)
            buckets.append(float(step * scale))
        scale *= 10


class PrometheusStatLogger(StatLoggerBase):
    """Counters, gauges and histograms in a registry of its own (``self.registry``).

    Args:
        vllm_config: The model config (its ``served_model_name`` labels every series).
        engine_index: The engine's index (a label too).
        max_loras: ``--max-loras`` when LoRA is on: adds ``forkless:lora_requests_info``.
        num_speculative_tokens: With ``--speculative-config``: adds the spec-decode counters.
        kv_transfer: With ``--kv-transfer-config``: adds the external prefix cache's and the
            KV transfers' counters.
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0, max_loras: int | None = None,
                 num_speculative_tokens: int | None = None, kv_transfer: bool = False) -> None:
        super().__init__(vllm_config, engine_index)
        self.registry = CollectorRegistry()
        model = getattr(vllm_config, "served_model_name", None) or "model"
        labels = {"model_name": str(model), "engine": str(engine_index)}
        names = list(labels)
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=r).labels(**labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=r).labels(**labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**labels)

        self.num_running = gauge("forkless:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("forkless:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("forkless:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).")
        self.prefix_queries = counter("forkless:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("forkless:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("forkless:num_preemptions", "Requests preempted for lack of KV blocks.")
        self.prompt_tokens = counter("forkless:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("forkless:generation_tokens", "Tokens generated.")
        self.request_success = Counter("forkless:request_success", "Finished requests, by finish reason.",
                                       [*names, "finished_reason"], registry=r)
        self._labels = labels
        self.ttft = histogram("forkless:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS)
        self.itl = histogram("forkless:inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.tpot = histogram("forkless:request_time_per_output_token_seconds",
                              "Mean time per output token after the first, per finished request.", _ITL_BUCKETS)
        self.e2e = histogram("forkless:e2e_request_latency_seconds", "End-to-end request latency.",
                             _REQUEST_LATENCY_BUCKETS)
        # vLLM's phases of a finished request, from the engine core's event times (always
        # there: this logger runs only with statistics on, and then the engine core
        # records the events).
        self.queue_time = histogram("forkless:request_queue_time_seconds",
                                    "Time a request spent waiting before it was first scheduled.",
                                    _REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("forkless:request_prefill_time_seconds",
                                      "Time from a request's first scheduling to its first token.",
                                      _REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("forkless:request_decode_time_seconds",
                                     "Time from a request's first token to its last.", _REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("forkless:request_inference_time_seconds",
                                        "Time from a request's first scheduling to its last token.",
                                        _REQUEST_LATENCY_BUCKETS)
        token_buckets = _one_two_five_buckets(getattr(vllm_config, "max_model_len", None) or 2**16)
        self.req_prompt = histogram("forkless:request_prompt_tokens", "Prompt length of finished requests.", token_buckets)
        self.req_gen = histogram("forkless:request_generation_tokens", "Generated length of finished requests.", token_buckets)
        # vLLM's lora_requests_info: one series, its labels the adapters now running and
        # waiting (comma-separated), its value the time they were seen.
        self.max_loras = max_loras
        self.lora_info = None if max_loras is None else Gauge(
            "forkless:lora_requests_info", "LoRA adapters with running and waiting requests.",
            [*names, "max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r)
        self.lora_loads = None if max_loras is None else counter(
            "forkless:lora_loads", "LoRA adapters loaded from disk by the workers.")
        self.lora_evictions = None if max_loras is None else counter(
            "forkless:lora_evictions", "LoRA adapters evicted from the workers' host caches (--max-cpu-loras).")
        self._last_lora_loads = self._last_lora_evictions = 0
        # Speculative decoding (vLLM's names), with --speculative-config only.
        self.spec = None
        if num_speculative_tokens is not None:
            self.spec = {
                "num_drafts": counter("forkless:spec_decode_num_drafts", "Requests' draft sequences verified."),
                "num_draft_tokens": counter("forkless:spec_decode_num_draft_tokens", "Draft tokens verified."),
                "num_accepted_tokens": counter("forkless:spec_decode_num_accepted_tokens",
                                               "Draft tokens the target model accepted."),
            }
            per_pos = Counter("forkless:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted draft tokens by position in the draft (0: the first).",
                              [*names, "position"], registry=r)
            self.spec_per_pos = [per_pos.labels(**labels, position=str(j)) for j in range(num_speculative_tokens)]
            self._last_spec = SpecDecodeStats()
        # KV connectors (tokens, bytes, seconds), with --kv-transfer-config only.
        self.kv = None
        if kv_transfer:
            self.kv = {
                "external_prefix_cache_queries": counter(
                    "forkless:external_prefix_cache_queries",
                    "Prompt tokens looked up in the KV connector's store (those the local prefix cache lacked)."),
                "external_prefix_cache_hits": counter(
                    "forkless:external_prefix_cache_hits", "Prompt tokens found in the KV connector's store."),
                "load_bytes": counter("forkless:kv_transfer_load_bytes", "KV bytes loaded by the KV connector."),
                "load_seconds": counter("forkless:kv_transfer_load_seconds", "Time the KV connector spent loading."),
                "save_bytes": counter("forkless:kv_transfer_save_bytes", "KV bytes saved by the KV connector."),
                "save_seconds": counter("forkless:kv_transfer_save_seconds", "Time the KV connector spent saving."),
            }
            self._last_kv = KVTransferStats()
        # counters in SchedulerStats are cumulative; Prometheus wants increments
        self._last_queries = self._last_hits = self._last_preemptions = 0

    def record(self, scheduler_stats: "SchedulerStats | None",
               iteration_stats: "IterationStats | None",
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            s = scheduler_stats
            self.num_running.set(s.num_running)
            self.num_waiting.set(s.num_waiting)
            self.kv_usage.set(s.kv_cache_usage)
            self.prefix_queries.inc(max(0, s.prefix_cache_queries - self._last_queries))
            self.prefix_hits.inc(max(0, s.prefix_cache_hits - self._last_hits))
            self.preemptions.inc(max(0, s.num_preemptions - self._last_preemptions))
            self._last_queries, self._last_hits = s.prefix_cache_queries, s.prefix_cache_hits
            self._last_preemptions = s.num_preemptions
            if self.lora_info is not None:
                self.lora_info.clear()
                self.lora_info.labels(**self._labels, max_lora=str(self.max_loras),
                                      running_lora_adapters=",".join(sorted(s.running_lora_adapters)),
                                      waiting_lora_adapters=",".join(sorted(s.waiting_lora_adapters)),
                                      ).set_to_current_time()
            if self.spec is not None and s.spec_decode is not None:
                last, now = self._last_spec, s.spec_decode
                for name, metric in self.spec.items():
                    metric.inc(max(0, getattr(now, name) - getattr(last, name)))
                previous = last.num_accepted_tokens_per_pos
                for j, (metric, n) in enumerate(zip(self.spec_per_pos, now.num_accepted_tokens_per_pos)):
                    metric.inc(max(0, n - (previous[j] if j < len(previous) else 0)))
                self._last_spec = now
            if self.kv is not None and s.kv_transfer is not None:
                for name, metric in self.kv.items():
                    metric.inc(max(0, getattr(s.kv_transfer, name) - getattr(self._last_kv, name)))
                self._last_kv = s.kv_transfer
            if self.lora_loads is not None and self.lora_evictions is not None:
                self.lora_loads.inc(max(0, s.lora_loads - self._last_lora_loads))
                self.lora_evictions.inc(max(0, s.lora_evictions - self._last_lora_evictions))
                self._last_lora_loads, self._last_lora_evictions = s.lora_loads, s.lora_evictions
        if iteration_stats is not None:
            it = iteration_stats
            self.prompt_tokens.inc(it.num_prompt_tokens)
            self.generation_tokens.inc(it.num_generation_tokens)
            for v in it.time_to_first_tokens:
                self.ttft.observe(v)
            for v in it.inter_token_latencies:
                self.itl.observe(v)
            for f in it.finished_requests:
                self.request_success.labels(**self._labels, finished_reason=f.finish_reason).inc()
                self.e2e.observe(f.e2e_latency)
                self.tpot.observe(f.mean_time_per_output_token)
                self.queue_time.observe(f.queued_time)
                self.prefill_time.observe(f.prefill_time)
                self.decode_time.observe(f.decode_time)
                self.inference_time.observe(f.inference_time)
                self.req_prompt.observe(f.num_prompt_tokens)
                self.req_gen.observe(f.num_generation_tokens)

    def log_engine_initialized(self) -> None:
        pass

    def render(self) -> bytes:
        """The exposition text for ``GET /metrics``."""
        return generate_latest(self.registry)
