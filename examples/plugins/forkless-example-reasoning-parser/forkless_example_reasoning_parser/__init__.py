"""Registers the ``thought_tag`` reasoning parser with forkless, by path.

Select it with ``forkless serve --reasoning-parser thought_tag``. The parser module is
imported only when a server selects it.
"""


def register() -> None:
    from forkless.reasoning import ReasoningParserManager

    ReasoningParserManager.register_lazy_module("thought_tag", "forkless_example_reasoning_parser.parser:ThoughtTagReasoningParser")
