"""``LoRAResolverRegistry``: the resolvers general plugins register, in registration order.

Invariants:
    * Resolvers are instances (vLLM's contract); a class or a ``"pkg.mod:Class"`` path is
      accepted too and instantiated with no arguments on first use, so registering stays
      cheap in processes that never resolve.
    * Registering a name again with the same target is a no-op (plugins run once per
      process and must be re-entrant); a different target replaces it with a warning and
      keeps its place in the order.
    * A resolver's ``resolve_lora`` is an ``async def`` (the server awaits it): a class or
      instance whose method is not is refused when registered, a path when resolved.
"""

from __future__ import annotations

import inspect
from typing import Any

from forkless.logger import init_logger
from forkless.lora.interface import LoRAResolver
from forkless.plugins import import_path

logger = init_logger(__name__)


class _LoRAResolverRegistry:
    """Named LoRA resolvers (public tier)."""

    def __init__(self) -> None:
        # name -> instance, class or path (insertion order is the resolution order)
        self._resolvers: dict[str, Any] = {}

    def register_resolver(self, resolver_name: str, resolver: Any) -> None:
        """Register a resolver.

        Args:
            resolver_name: Its name (``forkless plugins list`` shows the plugin; messages
                and the log use this name).
            resolver: A :class:`LoRAResolver` instance, a subclass, or its path
                ``"pkg.mod:Class"``.

        Raises:
            TypeError: ``resolver`` is none of those.
            ValueError: ``resolver_name`` is empty.
        """
        if not isinstance(resolver_name, str) or not resolver_name:
            raise ValueError(f"a resolver name must be a non-empty string, got {resolver_name!r}")
        ok = isinstance(resolver, (LoRAResolver, str)) or (
            isinstance(resolver, type) and issubclass(resolver, LoRAResolver))
        if not ok:
            raise TypeError(f"resolver {resolver_name!r}: expected a LoRAResolver instance, subclass or "
                            f"'pkg.mod:Class' path, got {type(resolver).__name__}")
        if not isinstance(resolver, str):
            _check_async(resolver_name, resolver)
        old = self._resolvers.get(resolver_name)
        if old is not None and old is not resolver and old != resolver:
            logger.warning("LoRA resolver %r is registered again with another target: %r replaces %r",
                           resolver_name, resolver, old)
        self._resolvers[resolver_name] = resolver

    @property
    def resolvers(self) -> dict[str, LoRAResolver]:
        """Name -> resolver instance, in resolution order (vLLM's attribute; reading it
        instantiates resolvers registered as classes or paths)."""
        return {name: self.get_resolver(name) for name in list(self._resolvers)}

    def get_supported_resolvers(self) -> list[str]:
        """The registered resolver names, in registration (resolution) order."""
        return list(self._resolvers)

    def get_resolver(self, resolver_name: str) -> LoRAResolver:
        """The resolver registered under ``resolver_name`` (instantiated on first use).

        Raises:
            KeyError: No such resolver; the message lists the registered ones.
            TypeError: A registered path does not name a ``LoRAResolver`` subclass.
        """
        if resolver_name not in self._resolvers:
            known = ", ".join(self._resolvers) or "none"
            raise KeyError(f"no LoRA resolver named {resolver_name!r}; registered: {known}")
        target = self._resolvers[resolver_name]
        if isinstance(target, str):
            target = import_path(target)
        if isinstance(target, type):
            if not issubclass(target, LoRAResolver):
                raise TypeError(f"LoRA resolver {resolver_name!r}: {target!r} does not subclass "
                                "forkless.lora.LoRAResolver")
            _check_async(resolver_name, target)
            target = target()
            self._resolvers[resolver_name] = target
        return target

    def snapshot(self) -> dict[str, str]:
        """``name -> what was registered`` (a path, or a description of the object), in
        resolution order, without importing or instantiating anything."""
        def describe(target: Any) -> str:
            if isinstance(target, str):
                return target
            cls = target if isinstance(target, type) else type(target)
            what = f"{cls.__module__}:{cls.__qualname__}"
            return what if isinstance(target, type) else f"<{what} instance>"

        return {name: describe(target) for name, target in self._resolvers.items()}

    def unregister_resolver(self, resolver_name: str) -> None:
        """Forget a resolver (tests); unknown names are ignored."""
        self._resolvers.pop(resolver_name, None)


def _check_async(resolver_name: str, resolver: Any) -> None:
    """Refuse a resolver whose ``resolve_lora`` the server could not await."""
    cls = resolver if isinstance(resolver, type) else type(resolver)
    if not inspect.iscoroutinefunction(cls.resolve_lora):
        raise TypeError(f"LoRA resolver {resolver_name!r}: {cls.__module__}.{cls.__qualname__}.resolve_lora must be "
                        "an async def (the server awaits it), not a plain function")


#: The process-wide registry (vLLM's ``LoRAResolverRegistry``).
LoRAResolverRegistry = _LoRAResolverRegistry()
