"""Workers: one per device; each owns a model runner, its model and its KV cache."""
