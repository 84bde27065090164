"""Registers the ``naive`` attention backend: select it with ``--attention-backend naive``."""


def register() -> None:
    from forkless.attention import register_attention_backend

    register_attention_backend("naive", "forkless_example_attention.backend:NaiveAttentionBackend")
