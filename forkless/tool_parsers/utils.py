"""Helpers for tool parsers, under vLLM's names (``vllm.tool_parsers.utils`` renamed).

Parsers ported from vLLM import these to stream a call's arguments as the model writes
them (common prefixes and suffixes of two partial parses, the text between them), to
parse unfinished JSON, and to build the schema a forced tool choice constrains the output
to. forkless's own parsers scan the raw text instead (:mod:`forkless.tool_parsers.json_scan`),
so that streamed pieces always add up to the whole result.

``partial_json_loads`` needs the ``partial-json-parser`` package, as in vLLM; it is not a
dependency of forkless, so a parser that uses it lists it among its own.
"""

from __future__ import annotations

import ast
import copy
import json
import warnings
from typing import TYPE_CHECKING, Any

from forkless.protocol.openai import ChatCompletionToolParam, NamedToolChoice

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Tool",
    "consume_space",
    "extract_intermediate_diff",
    "find_all_indices",
    "find_common_prefix",
    "find_common_suffix",
    "get_json_schema_from_tools",
    "is_complete_json",
    "partial_json_loads",
    "partial_tag_overlap",
    "safe_literal_eval",
]

#: vLLM's type of a request's tool (a chat tool or a Responses one). The Responses API's
#: function tools reach forkless's parsers as chat tools, so it is the chat tool here.
Tool = ChatCompletionToolParam

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def partial_tag_overlap(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``.

    ``partial_tag_overlap("reply <tool_", "<tool_call>")`` is 6: a streaming parser holds
    those characters back until it knows whether the tag follows.
    """
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def find_common_prefix(s1: str, s2: str) -> str:
    """The longest common prefix of two strings (in either order)."""
    n = 0
    for a, b in zip(s1, s2):
        if a != b:
            break
        n += 1
    return s1[:n]


def find_common_suffix(s1: str, s2: str) -> str:
    """The longest common suffix of two strings that holds no letter or digit.

    On two partial parses of a JSON value it is the closing punctuation both have
    (``'"}'`` for ``'{"a": "ap"}'`` and ``'{"a": "apple"}'``), which a stream must not send
    before the value is finished.
    """
    n = 0
    for a, b in zip(reversed(s1), reversed(s2)):
        if a != b or a.isalnum():
            break
        n += 1
    return s1[len(s1) - n:]


def extract_intermediate_diff(curr: str, old: str) -> str:
    """What ``curr`` (the newer partial parse) adds to ``old`` between their common prefix
    and their common closing suffix: the piece of arguments to stream now.

    ``extract_intermediate_diff('{"a": "apple"}', '{"a": "ap"}')`` is ``'ple'``. The order
    of the arguments matters.
    """
    suffix = find_common_suffix(curr, old)
    if suffix:
        old = old[: len(old) - len(suffix)]
        curr = curr[: len(curr) - len(suffix)]
    prefix = find_common_prefix(curr, old)
    return curr[len(prefix):]


def find_all_indices(string: str, substring: str) -> list[int]:
    """Every index where ``substring`` starts in ``string`` (overlapping ones too)."""
    indices = []
    i = string.find(substring)
    while i != -1:
        indices.append(i)
        i = string.find(substring, i + 1)
    return indices


def partial_json_loads(input_str: str, flags: Any) -> tuple[Any, int]:
    """Parse JSON that may be unfinished or followed by more text.

    Args:
        input_str: The text.
        flags: What may be partial (``partial_json_parser.core.options.Allow``).

    Returns:
        The value and how many characters of ``input_str`` it took.

    Raises:
        ImportError: ``partial-json-parser`` is not installed.
        json.JSONDecodeError: The text is not (the start of) a JSON value.
    """
    try:
        import partial_json_parser
    except ImportError as e:
        raise ImportError("partial_json_loads needs the partial-json-parser package "
                          "(pip install partial-json-parser), as vLLM's does") from e
    try:
        return partial_json_parser.loads(input_str, flags), len(input_str)
    except json.JSONDecodeError as e:
        if "Extra data" not in e.msg:
            raise
        # A complete value followed by more text: the partial parser refuses it.
        return json.JSONDecoder().raw_decode(input_str)


def is_complete_json(input_str: str) -> bool:
    """Whether ``input_str`` is one whole JSON value."""
    try:
        json.loads(input_str)
    except json.JSONDecodeError:
        return False
    return True


def consume_space(i: int, s: str) -> int:
    """The first index at or after ``i`` where ``s`` has no whitespace."""
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def safe_literal_eval(text: str) -> Any:
    """``ast.literal_eval`` without its ``SyntaxWarning`` on odd escapes in model output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.literal_eval(text)


def _tool_name_and_parameters(tool: Any) -> tuple[str, dict[str, Any] | None]:
    if isinstance(tool, dict):
        tool = ChatCompletionToolParam.model_validate(tool)
    if not isinstance(tool, ChatCompletionToolParam):
        raise TypeError(f"expected a chat completions tool (type 'function'), got {type(tool).__name__}")
    return tool.function.name, tool.function.parameters


def get_json_schema_from_tools(tool_choice: Any, tools: Sequence[Any] | None,
                               parallel_tool_calls: bool = True) -> dict[str, Any] | None:
    """The JSON schema that a forced tool choice constrains the model's output to.

    A named function (``{"type": "function", "function": {"name": ...}}``): its arguments
    object, valid against its ``parameters``. ``"required"``: a JSON array of
    ``{"name", "parameters"}`` objects, one per call, each naming a tool and valid against
    its schema; the tools' ``$defs`` and ``definitions`` are gathered at the top of the
    schema, where their ``$ref``s point, and their other local ``$ref``s follow them.
    ``"none"``, ``"auto"`` or no tools: ``None`` (no constraint).

    Args:
        tool_choice: The request's ``tool_choice``.
        tools: The request's tools (``ChatCompletionToolParam`` or their dicts).
        parallel_tool_calls: ``False`` allows one call only (``"required"``).

    Raises:
        ValueError: The named function is not among the tools, or two tools define one
            ``$defs`` (or ``definitions``) name differently.
    """
    if tools is None or tool_choice in (None, "none", "auto"):
        return None
    named = [_tool_name_and_parameters(t) for t in tools]
    if isinstance(tool_choice, dict):
        tool_choice = NamedToolChoice.model_validate(tool_choice)
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        for tool_name, parameters in named:
            if tool_name == name:
                return parameters or dict(_EMPTY_PARAMETERS)
        raise ValueError(f"tool_choice names function {name!r}, which is not in tools "
                         f"({', '.join(repr(n) for n, _ in named) or 'none given'})")
    if tool_choice != "required":
        raise ValueError(f"tool_choice {tool_choice!r} is not 'none', 'auto', 'required' or a named function")
    # Definitions under either keyword (draft 2019's "$defs", draft 7's "definitions", which
    # pydantic v1 and zod write) move to the top, where "#/$defs/..." and "#/definitions/..."
    # point; any other local reference ("#" itself, "#/properties/...") is made to point
    # into the tool's parameters where they now sit.
    defs: dict[str, dict[str, Any]] = {"$defs": {}, "definitions": {}}
    calls = []
    for i, (tool_name, parameters) in enumerate(named):
        parameters = copy.deepcopy(parameters) if parameters else dict(_EMPTY_PARAMETERS)
        for keyword, gathered in defs.items():
            for def_name, def_schema in parameters.pop(keyword, {}).items():
                if def_name in gathered and gathered[def_name] != def_schema:
                    raise ValueError(f"tools define {keyword} {def_name!r} differently; a forced tool choice "
                                     "needs one schema per name")
                gathered[def_name] = def_schema
        where = "/items" + ("" if len(named) == 1 else f"/anyOf/{i}") + "/properties/parameters"
        _relocate_refs(parameters, where)
        calls.append({"type": "object",
                      "properties": {"name": {"type": "string", "enum": [tool_name]}, "parameters": parameters},
                      "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    for keyword, gathered in defs.items():
        if gathered:
            schema[keyword] = gathered
    return schema


def _relocate_refs(schema: Any, where: str) -> None:
    """Point ``schema``'s local ``$ref``s, other than to the gathered definitions, at
    ``where`` (the JSON pointer it now sits at), in place; walks iteratively."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and \
                    not ref.startswith(("#/$defs/", "#/definitions/")):
                node["$ref"] = "#" + where + ref[1:]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
