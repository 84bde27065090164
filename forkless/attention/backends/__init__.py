"""Built-in attention backends (imported only by the worker that selects one)."""
