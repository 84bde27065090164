"""Torch-free checks of a request's constraint, shared by the built-in backends.

Runs in the API server (and offline before a request is queued), so a bad schema, regex
or grammar is refused there, with a message naming the problem, and never reaches the
engine core. llguidance (a Rust parser, no torch) checks the syntax for both built-ins.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkless.sampling_params import StructuredOutputsParams
    from forkless.structured_output.config import StructuredOutputsConfig

# JSON-schema keywords that a grammar cannot enforce (they need to compare values seen
# earlier, or to exclude a language): refused rather than silently not enforced.
UNENFORCEABLE_KEYWORDS = ("uniqueItems", "contains", "minContains", "maxContains", "not",
                          "dependentSchemas", "dependentRequired", "if", "then", "else",
                          "unevaluatedProperties", "unevaluatedItems")


def schema_of(params: StructuredOutputsParams) -> Any:
    """The request's JSON schema as an object (``json`` may be its text).

    Raises:
        ValueError: ``json`` is text that does not parse, or not an object / boolean.
    """
    schema = params.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"structured_outputs.json must be a JSON schema object, got {type(schema).__name__}")
    return schema


def _no_additional_properties(schema: Any) -> Any:
    """A copy where every object schema without ``additionalProperties`` forbids them."""
    if isinstance(schema, list):
        return [_no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_spec(params: StructuredOutputsParams, config: StructuredOutputsConfig) -> tuple[str, str, bool]:
    """``(request_type, spec, any_whitespace)`` for ``compile_grammar``, the same for
    equal constraints (the engine core's compile cache is keyed on it).

    A schema keeps its key order: the grammars write an object's properties in the order
    its ``properties`` lists them (a schema asking for ``reasoning`` before ``answer``
    gets them in that order), so two orders are two constraints.
    """
    kind = params.kind
    any_whitespace = not (params.disable_any_whitespace or config.disable_any_whitespace)
    if kind == "json":
        schema = schema_of(params)
        if params.disable_additional_properties or config.disable_additional_properties:
            schema = _no_additional_properties(schema)
        return kind, json.dumps(schema), any_whitespace
    if kind == "choice":
        return kind, json.dumps(params.choice), any_whitespace
    if kind == "json_object":
        return kind, "", any_whitespace
    return kind, params.regex if kind == "regex" else params.grammar, any_whitespace  # type: ignore[return-value]


def unenforceable_keywords(schema: Any) -> list[str]:
    """The keywords of :data:`UNENFORCEABLE_KEYWORDS` used anywhere in ``schema``
    (property names are names, not keywords, and are skipped)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in UNENFORCEABLE_KEYWORDS:
                    found.add(key)
                if key in ("properties", "$defs", "definitions", "patternProperties"):
                    if isinstance(value, dict):
                        stack.extend(value.values())
                elif key not in ("enum", "const", "default", "examples", "required"):
                    stack.append(value)
    return sorted(found)


def is_lark(grammar: str) -> bool:
    """Whether a grammar is Lark (``start: ...``) rather than EBNF/GBNF (``root ::= ...``)."""
    return "::=" not in grammar


def llguidance_grammar(kind: str, spec: str) -> str:
    """The llguidance grammar of a constraint (its own text format).

    Raises:
        ValueError: The constraint does not parse (regex syntax, GBNF conversion...).
    """
    import llguidance

    if kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(spec)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}')
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        return llguidance.grammar_from("choice", spec)
    return llguidance.grammar_from("grammar", spec)


def llguidance_problems(kind: str, spec: str, *, strict: bool) -> list[str]:
    """What llguidance finds wrong with a constraint: errors, and with ``strict`` also
    the features it would not enforce ("Unimplemented keys").

    Checking one builds its grammar (~0.5 ms for a small JSON schema, over a second for
    50,000 choices; llguidance releases the GIL meanwhile); ``choose_backend`` remembers
    the answers.
    """
    return _problems(kind, spec, strict)


def _problems(kind: str, spec: str, strict: bool) -> list[str]:
    import llguidance

    try:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(llguidance_grammar(kind, spec))
    except ValueError as exc:
        return [str(exc)]
    if is_error:
        return [m.strip() for m in messages] or ["the grammar does not compile"]
    if strict:
        return [m.strip() for m in messages if "Unimplemented" in m or "unsupported" in m.lower()]
    return []


def describe(kind: str) -> str:
    """How the problem's subject is named in messages."""
    return {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
            "grammar": "grammar"}[kind]
