"""Which logits processors a worker runs, and request validation against them.

The set is: the built-ins, then the classes named by ``--logits-processors`` (in the order
given), then the ``forkless.logits_processors`` entry points (sorted by name). A class
listed twice runs once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from forkless.logits_processors.interface import LogitsProcessor

if TYPE_CHECKING:
    import torch

    from forkless.sampling_params import SamplingParams


LOGITS_PROCESSORS_GROUP = "forkless.logits_processors"
CLI_FLAG = "--logits-processors"

# Paths, not classes: importing this module must not import torch (the API server
# imports it to validate requests).
BUILTIN_LOGITS_PROCESSORS: tuple[str, ...] = (
    "forkless.logits_processors.min_tokens:MinTokensLogitsProcessor",
    "forkless.logits_processors.logit_bias:LogitBiasLogitsProcessor",
    "forkless.logits_processors.min_p:MinPLogitsProcessor",
    "forkless.logits_processors.allowed_token_ids:AllowedTokenIdsLogitsProcessor",
    "forkless.logits_processors.bad_words:BadWordsLogitsProcessor",
    # Last: a forced end of the reasoning overrides the masks of the others.
    "forkless.logits_processors.thinking_budget:ThinkingTokenBudgetLogitsProcessor",
)


def _split_flag(custom: str | type | Sequence[str | type] | None) -> list[str | type]:
    if custom is None:
        return []
    if isinstance(custom, (str, type)):
        custom = [custom]
    out: list[str | type] = []
    for item in custom:
        if isinstance(item, str):
            # The CLI value is "a.b:C,d.e:F"; accept it unsplit too.
            out.extend(part.strip() for part in item.split(",") if part.strip())
        else:
            out.append(item)
    return out


def load_custom_classes(
    custom: str | type | Sequence[str | type] | None = None, *, entry_points: bool = True
) -> list[type[LogitsProcessor]]:
    """Resolve the user-selected logits processor classes (not the built-ins).

    Args:
        custom: Values of ``--logits-processors``: class paths (``"pkg.mod:Class"``,
            comma-separated lists accepted) or classes.
        entry_points: Also load the ``forkless.logits_processors`` entry-point group.

    Returns:
        The classes, flag ones first, without duplicates.

    Raises:
        ValueError: A value is not a class path.
        PluginImportError: A path does not import (the message names it and why).
        TypeError: A value is not a ``LogitsProcessor`` subclass.
    """
    from forkless.plugins import resolve_class

    classes: list[type[LogitsProcessor]] = []
    for item in _split_flag(custom):
        cls = resolve_class(item, LogitsProcessor, CLI_FLAG)
        if cls not in classes:
            classes.append(cls)
    if entry_points:
        for cls in _entry_point_classes():
            if cls not in classes:
                classes.append(cls)
    return classes


def _entry_point_classes() -> list[type[LogitsProcessor]]:
    from forkless.plugins import load_plugins_by_group, reject_plugin

    out: list[type[LogitsProcessor]] = []
    for name, obj in load_plugins_by_group(LOGITS_PROCESSORS_GROUP).items():
        if isinstance(obj, type) and issubclass(obj, LogitsProcessor):
            out.append(obj)
            continue
        reject_plugin(LOGITS_PROCESSORS_GROUP, name, f"entry point {name!r} in group {LOGITS_PROCESSORS_GROUP} is "
                      f"{obj!r}, not a subclass of {LogitsProcessor.__module__}.{LogitsProcessor.__qualname__}")
    return out


def build_logits_processors(
    config: Any,
    device: "torch.device",
    is_pin_memory: bool,
    custom: str | type | Sequence[str | type] | None = None,
    *,
    entry_points: bool = True,
) -> list[LogitsProcessor]:
    """Instantiate every logits processor a worker runs.

    Args:
        config: The engine configuration, passed to each processor.
        device: The device the logits live on.
        is_pin_memory: Whether processors may use pinned host memory.
        custom: Values of ``--logits-processors`` (see ``load_custom_classes``).
        entry_points: Also load the ``forkless.logits_processors`` entry-point group.

    Returns:
        Built-ins first (min_tokens, logit_bias, min_p, allowed_token_ids, bad_words),
        then the custom ones.

    Raises:
        ValueError, PluginImportError, TypeError: As ``load_custom_classes``.
    """
    from forkless.plugins import import_path

    builtins = [import_path(path) for path in BUILTIN_LOGITS_PROCESSORS]
    classes = builtins + [
        c for c in load_custom_classes(custom, entry_points=entry_points) if c not in builtins
    ]
    return [cls(config, device, is_pin_memory) for cls in classes]


def validate_request_params(
    params: "SamplingParams",
    custom_classes: Iterable[type[LogitsProcessor]],
    vocab_size: int | None = None,
) -> None:
    """Reject a request before it reaches a worker (called by the API server / engine).

    Args:
        params: The request's parameters (already field-validated by ``SamplingParams``).
        custom_classes: The classes from ``load_custom_classes``; each one's
            ``validate_params`` runs.
        vocab_size: When known, token ids in ``logit_bias``, ``stop_token_ids`` and
            ``allowed_token_ids`` must be below it, and so must ``logprobs`` and
            ``prompt_logprobs`` (there are no more tokens to return).

    Raises:
        ValueError: A processor rejected the request, or a token id is out of range.
    """
    if vocab_size is not None:
        for field in ("logit_bias", "stop_token_ids", "allowed_token_ids"):
            ids = getattr(params, field) or ()
            bad = sorted(t for t in ids if t >= vocab_size)
            if bad:
                raise ValueError(
                    f"SamplingParams.{field} has token ids {bad} outside the vocabulary: "
                    f"expected ids in [0, {vocab_size})"
                )
        for field in ("logprobs", "prompt_logprobs"):
            count = getattr(params, field)
            if count is not None and count > vocab_size:
                raise ValueError(
                    f"SamplingParams.{field}={count} asks for more tokens than the vocabulary "
                    f"has: expected at most {vocab_size}"
                )
    for cls in custom_classes:
        cls.validate_params(params)
