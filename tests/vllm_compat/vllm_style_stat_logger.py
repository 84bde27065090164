"""A stat logger written the way vLLM's own are, with only the imports renamed."""

from forkless.v1.engine import FinishReason
from forkless.v1.metrics.loggers import StatLoggerBase
from forkless.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats


class CountingStatLogger(StatLoggerBase):
    # vLLM's StatLoggerBase.__init__ is abstract: a vLLM logger sets its own state. vLLM
    # calls a factory as factory(vllm_config, engine_idx), both positionally.
    def __init__(self, vllm_config, engine_idx: int = 0):
        self.vllm_config = vllm_config
        self.engine_idx = engine_idx
        self.records: list[tuple[int, int]] = []
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.ttfts: list[float] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.steps: list[int] = []
        self.finished: list[tuple[int, int, float]] = []  # (cached tokens, tokens, TPOT)
        self.reasons: list[str] = []
        self.initialized = False
        self.num_gpu_blocks = None
        model_config = vllm_config.model_config
        self.model = (model_config.architectures[0], model_config.get_vocab_size(), model_config.get_hidden_size(),
                      model_config.hf_config.num_hidden_layers)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               mm_cache_stats: MultiModalCacheStats | None = None, engine_idx: int = 0):
        if scheduler_stats is not None:
            self.running.append(scheduler_stats.num_running_reqs)
            self.waiting.append(scheduler_stats.num_waiting_reqs)
            # vLLM's per-interval prefix-cache counters, summed as vLLM's loggers do.
            self.prefix_queries += scheduler_stats.prefix_cache_stats.queries
            self.prefix_hits += scheduler_stats.prefix_cache_stats.hits
            self.steps.append(scheduler_stats.step_counter)
        if iteration_stats is not None:
            self.records.append((engine_idx, iteration_stats.num_generation_tokens))
            self.ttfts.extend(iteration_stats.time_to_first_tokens_iter)
            for req in iteration_stats.finished_requests:
                self.finished.append((req.num_cached_tokens, req.num_generation_tokens,
                                      req.mean_time_per_output_token))
                if req.finish_reason == FinishReason.LENGTH:
                    self.reasons.append(str(req.finish_reason))

    def log_engine_initialized(self):
        self.initialized = True
        self.num_gpu_blocks = self.vllm_config.cache_config.num_gpu_blocks
