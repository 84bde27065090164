"""The engine core's pure-Python state: requests, the KV-cache block manager, scheduling.

Nothing under ``forkless.core`` imports torch: the engine-core process only does
bookkeeping, and the model runner owns the tensors.
"""
