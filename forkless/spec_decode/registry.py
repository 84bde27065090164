"""``ProposerRegistry``: speculative proposers by name, imported on first use.

``--speculative-config``'s ``method`` is a name registered here (the built-ins ``ngram`` and
``draft_model``, the latter in ``forkless.worker.draft_model`` since it runs a model in the
worker), or one a general plugin registers with
:meth:`ProposerRegistry.register`) or a ``pkg.mod:Class`` path; an unknown name is an
error listing the registered ones.
"""

from __future__ import annotations

from typing import Any

from forkless.plugins import LazyRegistry, canonical_path, import_path
from forkless.spec_decode.interface import Proposer

_BUILTIN_PROPOSERS = {
    "ngram": "forkless.spec_decode.ngram:NgramProposer",
    "draft_model": "forkless.worker.draft_model:DraftModelProposer",
}


class _ProposerRegistry:
    """Named speculative proposers (provisional tier)."""

    def __init__(self) -> None:
        self._registry: LazyRegistry[type[Proposer]] = LazyRegistry(
            "speculative proposer", Proposer,
            "Register one with forkless.spec_decode.ProposerRegistry.register(name, 'pkg.mod:Class') "
            "from a general plugin, or give its class path as 'method'.")
        for name, path in _BUILTIN_PROPOSERS.items():
            self._registry.register(name, path)

    def register(self, name: str, proposer: Any) -> None:
        """Register a proposer under ``name`` (a ``Proposer`` subclass or its path)."""
        self._registry.register(name, proposer)

    def get_supported_methods(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._registry.names())

    def resolve(self, method: str) -> type[Proposer]:
        """The class for ``method``: a registered name, else a ``pkg.mod:Class`` path.

        Raises:
            forkless.plugins.RegistryError: An unknown name (the message lists the
                registered ones).
            forkless.plugins.PluginImportError: A path that does not import.
            TypeError: It is not a ``Proposer`` subclass, or leaves methods abstract.
        """
        if method in self._registry or (":" not in method and "." not in method):
            return self._registry.resolve(method)
        cls = import_path(canonical_path(method))
        if not (isinstance(cls, type) and issubclass(cls, Proposer)):
            raise TypeError(f"speculative method {method!r} is {cls!r}, not a forkless.spec_decode.Proposer subclass")
        return cls


ProposerRegistry = _ProposerRegistry()
