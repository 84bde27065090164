"""A stat logger written the way vLLM's own are, with only the imports renamed."""

from forkless.metrics import StatLoggerBase


class CountingStatLogger(StatLoggerBase):
    # vLLM's StatLoggerBase.__init__ is abstract: a vLLM logger sets its own state.
    def __init__(self, vllm_config, engine_index: int = 0):
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.records: list[tuple[int, int]] = []
        self.initialized = False

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if iteration_stats is not None:
            self.records.append((engine_idx, iteration_stats.num_generation_tokens))

    def log_engine_initialized(self):
        self.initialized = True
