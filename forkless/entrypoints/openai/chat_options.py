"""Server-wide chat settings: template override, tool and reasoning parsers.

Everything is checked when the server starts, so that a typo in a parser name or a
broken plugin file stops ``forkless serve`` at once instead of failing each request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from forkless.plugins import RegistryError


@dataclass
class ChatOptions:
    """Validated chat settings of one server.

    Attributes:
        chat_template: A Jinja template replacing the model's (``--chat-template``).
        tool_parser: Name of the tool parser (``--tool-call-parser``).
        enable_auto_tool_choice: Parse tool calls for ``tool_choice="auto"``.
        exclude_tools_when_tool_choice_none: Render a chat completion whose ``tool_choice``
            is ``"none"`` without its tools (``--exclude-tools-when-tool-choice-none``,
            vLLM's): the model is not shown functions it may not call.
        reasoning_parser: Name of the reasoning parser (``--reasoning-parser``).
        response_role: The role of the reply when the prompt ends with the generation
            prompt (``--response-role``, vLLM's); otherwise the reply continues the last
            message and has its role.
        trust_request_chat_template: A request may bring its own ``chat_template``
            (``--trust-request-chat-template``, vLLM's); otherwise that is a 400.
        chat_template_content_format: How the template gets each message's content
            (``--chat-template-content-format``, vLLM's): ``auto`` / ``string`` one string,
            ``openai`` a list of text parts.
    """

    chat_template: str | None = None
    tool_parser: str | None = None
    enable_auto_tool_choice: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    reasoning_parser: str | None = None
    response_role: str = "assistant"
    trust_request_chat_template: bool = False
    chat_template_content_format: str = "auto"

    @classmethod
    def from_cli_args(cls, args: Any) -> "ChatOptions":
        """Import parser plugins, check the parser names and load the template.

        Raises:
            ValueError: Unknown parser name (the message lists the registered ones), a
                missing or malformed template, or inconsistent flags.
            PluginImportError: A parser plugin failed to import (with its traceback).
            TypeError: A registered parser does not implement the interface.
        """
        from forkless.reasoning import ReasoningParserManager
        from forkless.tool_parsers import ToolParserManager

        if getattr(args, "tool_parser_plugin", None):
            ToolParserManager.import_tool_parser(args.tool_parser_plugin)
        if getattr(args, "reasoning_parser_plugin", None):
            ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
        options = cls(
            chat_template=load_chat_template(getattr(args, "chat_template", None)),
            tool_parser=getattr(args, "tool_call_parser", None),
            enable_auto_tool_choice=bool(getattr(args, "enable_auto_tool_choice", False)),
            exclude_tools_when_tool_choice_none=bool(getattr(args, "exclude_tools_when_tool_choice_none", False)),
            reasoning_parser=getattr(args, "reasoning_parser", None),
            response_role=getattr(args, "response_role", None) or "assistant",
            trust_request_chat_template=bool(getattr(args, "trust_request_chat_template", False)),
            chat_template_content_format=getattr(args, "chat_template_content_format", None) or "auto",
        )
        if options.enable_auto_tool_choice and not options.tool_parser:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME "
                             f"(registered: {', '.join(ToolParserManager.list_registered())})")
        checks = [("--tool-call-parser", options.tool_parser, ToolParserManager.get_tool_parser),
                  ("--reasoning-parser", options.reasoning_parser, ReasoningParserManager.get_reasoning_parser)]
        for flag, name, get in checks:
            if name:
                try:
                    get(name)
                except RegistryError as exc:
                    raise ValueError(f"{flag}: {exc}") from None
        return options


def load_chat_template(value: str | None) -> str | None:
    """Read ``--chat-template``: a file path, or the template itself (as vLLM accepts).

    Raises:
        ValueError: Neither an existing file nor something that looks like a template,
            or a template with a Jinja syntax error.
    """
    if value is None:
        return None
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            template = f.read()
    elif any(c in value for c in "{}\n"):
        template = value
    else:
        raise ValueError(f"--chat-template {value}: no such file (give a path to a Jinja "
                         "template file, or the template text itself)")
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template {value[:80]!r}: Jinja syntax error on line {exc.lineno}: "
                         f"{exc.message}") from None
    return template
