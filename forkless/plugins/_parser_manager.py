"""The registry front shared by ``ToolParserManager`` and ``ReasoningParserManager``."""

from __future__ import annotations

import inspect
import os
import sys
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

        Raises:
            TypeError: ``force`` is not a bool, or ``name`` is neither a string, a list of
                strings nor ``None`` (as vLLM checks).
        """
        if not isinstance(force, bool):
            raise TypeError(f"force must be a boolean, but got {type(force)}")
        if not (name is None or isinstance(name, str)
                or (isinstance(name, list) and all(isinstance(n, str) for n in name))):
            raise TypeError(f"name must be str, list[str], or None, got {name!r}")

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
    def register_lazy_module(cls, name: str, module_path: str, class_name: str | None = None) -> None:
        """Register a parser by where it lives; it is imported on first use.

        Both vLLM's form and forkless's one-string form are accepted::

            Manager.register_lazy_module("mine", "my_pkg.parser", "MyParser")
            Manager.register_lazy_module(name="mine", module_path="my_pkg.parser", class_name="MyParser")
            Manager.register_lazy_module("mine", "my_pkg.parser:MyParser")

        Args:
            name: The name users select it by.
            module_path: The module (``"pkg.mod"``), or the whole class path
                (``"pkg.mod:Class"``) when ``class_name`` is not given.
            class_name: The class in ``module_path``.

        Raises:
            ValueError: A malformed path.
        """
        path = f"{module_path}:{class_name}" if class_name is not None else module_path
        cls.registry.register(name, path)

    @classmethod
    def get(cls, name: str) -> Any:
        """The parser class registered as ``name``.

        Raises:
            RegistryError: Unknown name; the message lists the registered ones.
            PluginImportError: Its module does not import (with the traceback).
            TypeError: It is not a parser class, or it leaves abstract methods
                unimplemented (the message names them).
        """
        klass = cls.registry.resolve(name)
        missing = sorted(getattr(klass, "__abstractmethods__", ()))
        if missing:
            raise TypeError(f"{cls.registry.kind} {name!r} ({klass.__module__}.{klass.__qualname__}) does not "
                            f"implement {', '.join(missing)}")
        return klass

    @classmethod
    def create(cls, name: str, tokenizer: Any, *args: Any, **kwargs: Any) -> Any:
        """A new instance of the parser registered as ``name``.

        ``*args`` and ``**kwargs`` are what vLLM's server passes (a tool parser gets the
        request's ``tools``, a reasoning parser ``chat_template_kwargs=...``); those the
        parser's constructor does not take are left out, so parsers written for an older
        API still work.

        Raises:
            RegistryError, PluginImportError, TypeError: As :meth:`get`.
        """
        return construct_parser(cls.get(name), tokenizer, *args, **kwargs)

    @classmethod
    def list_registered(cls) -> list[str]:
        """The registered names, sorted."""
        return cls.registry.names()

    @classmethod
    def import_plugin(cls, spec: str) -> None:
        """Import a plugin file or module that registers parsers when imported.

        As vLLM does, a file is also importable under its own name afterwards (unless
        that name is taken), so ``register_lazy_module(name, "<file name>", cls)`` in it
        resolves.

        Raises:
            PluginImportError: With the plugin's traceback.
        """
        module = import_module_or_file(spec, cls.plugin_option)
        stem = os.path.splitext(os.path.basename(spec))[0]
        if module.__name__ != spec and stem.isidentifier() and stem not in sys.modules:
            sys.modules[stem] = module


def construct_parser(klass: type, tokenizer: Any, *args: Any, **kwargs: Any) -> Any:
    """``klass(tokenizer, *args, **kwargs)``, leaving out what its constructor does not take.

    The server passes what vLLM's does (a reasoning parser gets ``chat_template_kwargs``,
    a tool parser the request's ``tools``); a parser written for an older API whose
    constructor takes only the tokenizer is built without them instead of failing.
    """
    try:
        params = inspect.signature(klass).parameters.values()
    except (TypeError, ValueError):
        return klass(tokenizer, *args, **kwargs)
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        n_positional = 1 + len(args)
    else:
        n_positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        kwargs = {k: v for k, v in kwargs.items() if k in names}
    return klass(tokenizer, *args[: max(n_positional - 1, 0)], **kwargs)
