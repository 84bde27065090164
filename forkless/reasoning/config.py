"""``--reasoning-config``: where a model's reasoning starts and ends (vLLM's ``ReasoningConfig``).

``thinking_token_budget`` needs the token ids of the two markers: the budget counts the
tokens after the start marker, and once it is spent the engine forces the end marker. As
in vLLM, the markers are strings (``reasoning_start_str``, ``reasoning_end_str``) that
default to the reasoning parser's (``--reasoning-parser``: its ``reasoning_start_str`` and
``reasoning_end_str``), and each is tokenized whole, without special tokens, so an end
string may carry a closing phrase before ``</think>``.

Invariants:
    * Every key is vLLM's; an unknown key is an error naming it and the known ones.
    * The token ids are resolved where the tokenizer already is (the front end's
      ``Processor``), never in a worker: the requests that ask for a budget carry them to
      the workers (``SamplingParams.reasoning_start_token_ids`` / ``..._end_token_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forkless.json_arg import json_config_arg

FLAG = "--reasoning-config"


@dataclass(frozen=True)
class ReasoningConfig:
    """The reasoning markers of a model (vLLM's ``vllm.config.ReasoningConfig``).

    Attributes:
        reasoning_parser: The reasoning parser whose markers are the defaults
            (``--reasoning-parser`` sets it); ``""``: none.
        reasoning_start_str: The text that starts the reasoning (``"<think>"``); ``""``:
            the parser's.
        reasoning_end_str: The text that ends it (``"</think>"``), forced when a request's
            ``thinking_token_budget`` is spent; it may lead in with a phrase
            (``"Time to answer.</think>"``). ``""``: the parser's.
    """

    reasoning_parser: str = ""
    reasoning_start_str: str = ""
    reasoning_end_str: str = ""

    @classmethod
    def from_json(cls, value: str | dict[str, Any] | ReasoningConfig | None) -> ReasoningConfig | None:
        """Parse the flag's JSON (or a dict, or a config, as ``LLM(reasoning_config=...)`` takes).

        Returns:
            The config, or ``None`` for ``None``.

        Raises:
            ValueError: Not a JSON object, an unknown key, or a value that is not a string.
        """
        if value is None or isinstance(value, cls):
            return value
        value = json_config_arg(value, FLAG, cls)
        for name, item in value.items():
            if item is None:
                continue
            if not isinstance(item, str):
                raise ValueError(f"{FLAG}: {name}={item!r} is invalid: expected a string")
        return cls(**{k: v for k, v in value.items() if v is not None})

    def token_ids(self, tokenizer: Any, parser_plugin: str = "") -> tuple[list[int], list[int]] | None:
        """The start and end markers' token ids, as vLLM's ``initialize_token_ids`` makes
        them: each string (its own, else the parser's) encoded without special tokens.

        Args:
            tokenizer: The model's tokenizer.
            parser_plugin: ``--reasoning-parser-plugin``, imported before the parser is
                looked up (it may be what registers it).

        Returns:
            ``(start ids, end ids)``, or ``None`` when a marker is unknown: no string given
            and no parser, or a parser that names none (vLLM then warns, and refuses
            requests with a budget).

        Raises:
            ValueError: A marker string encodes to no token at all.
        """
        start, end = self.reasoning_start_str, self.reasoning_end_str
        if self.reasoning_parser and not (start and end):
            from forkless.reasoning.registry import ReasoningParserManager

            parser = ReasoningParserManager.resolve(self.reasoning_parser, parser_plugin or None)(tokenizer)
            start = start or parser.reasoning_start_str or ""
            end = end or parser.reasoning_end_str or ""
        if not start or not end:
            return None
        start_ids = [int(t) for t in tokenizer.encode(start, add_special_tokens=False)]
        end_ids = [int(t) for t in tokenizer.encode(end, add_special_tokens=False)]
        if not start_ids or not end_ids:
            raise ValueError(f"{FLAG}: failed to tokenize the reasoning strings: reasoning_start_str={start!r}, "
                             f"reasoning_end_str={end!r}; they must be text of the model's vocabulary")
        return start_ids, end_ids


__all__ = ["ReasoningConfig"]
