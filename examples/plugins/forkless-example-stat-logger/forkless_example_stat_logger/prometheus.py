"""A Prometheus stat logger plugin: a subclass of forkless's ``PrometheusStatLogger``.

As in vLLM, such a plugin replaces the default Prometheus logger instead of running beside
it, so ``/metrics`` shows the default series and this one's own: here, how many batches of
engine outputs it recorded and how many requests finished by reason of length.
"""

from prometheus_client import Counter

from forkless.metrics.prometheus import PrometheusStatLogger


class BatchCountingPrometheusStatLogger(PrometheusStatLogger):
    def __init__(self, vllm_config, engine_index: int = 0, **kwargs) -> None:
        # kwargs: the series the server adds for LoRA, speculative decoding and KV
        # connectors, passed on as given.
        super().__init__(vllm_config, engine_index, **kwargs)
        self.batches = Counter("forkless:example_output_batches", "Batches of engine outputs recorded.",
                               registry=self.registry)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        super().record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
        if iteration_stats is not None:
            self.batches.inc()
