"""Building blocks shared by the built-in decoder-only models."""
