"""Registers the ``function_tag`` tool parser with forkless, by path.

Select it with ``forkless serve --tool-call-parser function_tag --enable-auto-tool-choice``.
The parser module is imported only when a server selects it.
"""


def register() -> None:
    from forkless.tool_parsers import ToolParserManager

    ToolParserManager.register_lazy_module("function_tag", "forkless_example_tool_parser.parser:FunctionTagToolParser")
