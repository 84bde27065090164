"""``ReasoningParserManager``: the registry of reasoning parsers (``--reasoning-parser``)."""

from __future__ import annotations

from typing import ClassVar

from forkless.plugins import LazyRegistry, ParserManager
from forkless.reasoning.interface import ReasoningParser


class ReasoningParserManager(ParserManager):
    """Reasoning parsers by name.

    Register from a general plugin or a ``--reasoning-parser-plugin`` file::

        @ReasoningParserManager.register_module("my_parser")
        class MyParser(ReasoningParser): ...

        ReasoningParserManager.register_lazy_module("my_parser", "my_pkg.parser", "MyParser")
    """

    registry: ClassVar[LazyRegistry[type[ReasoningParser]]] = LazyRegistry(
        "reasoning parser", base=ReasoningParser,
        hint="Register one with ReasoningParserManager.register_module(name) from a "
             "general plugin or a --reasoning-parser-plugin file.",
    )
    plugin_option = "--reasoning-parser-plugin"

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        """The reasoning parser class registered as ``name``.

        Raises:
            RegistryError: Unknown name; the message lists the registered ones.
        """
        return cls.get(name)

    @classmethod
    def import_reasoning_parser(cls, plugin: str) -> None:
        """Import a ``.py`` file or module that registers reasoning parsers.

        Raises:
            PluginImportError: The import failed; the message carries its traceback.
        """
        cls.import_plugin(plugin)

    @classmethod
    def resolve(cls, name: str, plugin: str | None = None) -> type[ReasoningParser]:
        """The parser class ``name`` after importing ``plugin`` (``--reasoning-parser-plugin``),
        which may be what registers it: the one order every user of the two flags follows.

        Raises:
            PluginImportError: The plugin failed to import.
            RegistryError: Unknown name; the message lists the registered ones.
        """
        if plugin:
            cls.import_reasoning_parser(plugin)
        return cls.get_reasoning_parser(name)


ReasoningParserManager.register_lazy_module("deepseek_r1", "forkless.reasoning.deepseek_r1", "DeepSeekR1ReasoningParser")
ReasoningParserManager.register_lazy_module("qwen3", "forkless.reasoning.qwen3", "Qwen3ReasoningParser")
