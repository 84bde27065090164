"""``ToolParserManager``: the registry of tool parsers, selected by ``--tool-call-parser``."""

from __future__ import annotations

from typing import ClassVar

from forkless.plugins import LazyRegistry, ParserManager
from forkless.tool_parsers.interface import ToolParser


class ToolParserManager(ParserManager):
    """Tool parsers by name.

    Register from a general plugin or a ``--tool-parser-plugin`` file::

        @ToolParserManager.register_module("my_parser")
        class MyParser(ToolParser): ...

        ToolParserManager.register_lazy_module("my_parser", "my_pkg.parser", "MyParser")
    """

    registry: ClassVar[LazyRegistry[type[ToolParser]]] = LazyRegistry(
        "tool parser", base=ToolParser,
        hint="Register one with ToolParserManager.register_module(name) from a general "
             "plugin or a --tool-parser-plugin file.",
    )
    plugin_option = "--tool-parser-plugin"

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        """The tool parser class registered as ``name``.

        Raises:
            RegistryError: Unknown name; the message lists the registered ones.
        """
        return cls.get(name)

    @classmethod
    def import_tool_parser(cls, plugin: str) -> None:
        """Import a ``.py`` file or module that registers tool parsers.

        Raises:
            PluginImportError: The import failed; the message carries its traceback.
        """
        cls.import_plugin(plugin)


ToolParserManager.register_lazy_module("hermes", "forkless.tool_parsers.hermes", "Hermes2ProToolParser")
ToolParserManager.register_lazy_module("llama3_json", "forkless.tool_parsers.llama3_json", "Llama3JsonToolParser")
