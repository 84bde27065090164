"""Registers the ``choice_trie`` structured-output backend, by path (imported only in the
processes that use it)."""


def register() -> None:
    from forkless.structured_output import StructuredOutputBackendRegistry

    StructuredOutputBackendRegistry.register("choice_trie", "forkless_so_trie.backend:ChoiceTrieBackend")
