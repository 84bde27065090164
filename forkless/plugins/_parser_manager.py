"""The registry front shared by ``ToolParserManager`` and ``ReasoningParserManager``."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from forkless.plugins._file_import import import_module_or_file
from forkless.plugins._registry import LazyRegistry

C = TypeVar("C", bound=type)


class ParserManager:
    """Class-level registry of parsers by name (vLLM's manager API, on a ``LazyRegistry``).

    Subclasses set ``registry`` and ``plugin_option``.
    """

    registry: ClassVar[LazyRegistry[Any]]
    plugin_option: ClassVar[str] = "--parser-plugin"

    @classmethod
    def register_module(cls, name: str | list[str] | None = None, force: bool = True,
                        module: type | None = None) -> Any:
        """Register a parser class, directly or as a class decorator.

        ``@Manager.register_module("x")`` decorates; ``Manager.register_module("x",
        module=Cls)`` registers at once. Without a name, the class name is used.

        Args:
            name: The name(s) users select it by.
            force: Replace an existing registration (with a warning); when false, an
                existing different registration is an error.
            module: The class, for the non-decorator form.

        Returns:
            The class (direct form) or the decorator.
        """

        def do_register(klass: C) -> C:
            names = [name] if isinstance(name, str) else list(name or [klass.__name__])
            for n in names:
                if not force and n in cls.registry and cls.registry.get_path(n) is None \
                        and cls.registry.resolve(n) is not klass:
                    raise KeyError(f"{cls.registry.kind} {n!r} is already registered")
                cls.registry.register(n, klass)
            return klass

        if module is not None:
            return do_register(module)
        return do_register

    @classmethod
    def register_lazy_module(cls, name: str, path: str) -> None:
        """Register a parser by class path (``"pkg.mod:Class"``); imported on first use."""
        cls.registry.register(name, path)

    @classmethod
    def get(cls, name: str) -> Any:
        """The parser class registered as ``name``.

        Raises:
            RegistryError: Unknown name; the message lists the registered ones.
        """
        return cls.registry.resolve(name)

    @classmethod
    def list_registered(cls) -> list[str]:
        """The registered names, sorted."""
        return cls.registry.names()

    @classmethod
    def import_plugin(cls, spec: str) -> None:
        """Import a plugin file or module that registers parsers when imported.

        Raises:
            PluginImportError: With the plugin's traceback.
        """
        import_module_or_file(spec, cls.plugin_option)

