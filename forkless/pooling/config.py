"""Which runner a model gets, and how its hidden states are pooled (torch-free).

Invariants:
    * The choice is made once, in the engine configuration (``resolve_runner``), from the
      architecture, ``--runner``, ``--convert``, the sentence-transformers files of the
      model folder (``modules.json``, ``1_Pooling/config.json``,
      ``sentence_bert_config.json``) and ``--pooler-config`` (vLLM's keys), in that order
      of precedence from last to first.
    * A key or mode forkless does not implement is an error naming it, never ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkless.json_arg import json_object_arg

#: vLLM's pooling types that forkless implements (``STEP`` is not).
POOLING_TYPES = ("LAST", "ALL", "CLS", "MEAN")
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")

# Architectures that only pool: their default task and pooling type (vLLM's: BERT
# embeddings pool CLS unless the sentence-transformers files say otherwise; a causal
# classifier pools its last token).
POOLING_ARCHS: dict[str, tuple[str, str]] = {
    "BertModel": ("embed", "CLS"),
    "BertForSequenceClassification": ("classify", "CLS"),
    "LlamaForSequenceClassification": ("classify", "LAST"),
    "MistralForSequenceClassification": ("classify", "LAST"),
    "Qwen2ForSequenceClassification": ("classify", "LAST"),
    "Qwen3ForSequenceClassification": ("classify", "LAST"),
}
ENCODER_ARCHS = ("BertModel", "BertForSequenceClassification")

# vLLM's PoolerConfig keys. The first ones are implemented; the rest are refused by name.
_KEYS = ("pooling_type", "normalize", "dimensions", "use_activation", "activation", "softmax", "logit_bias")
_UNSUPPORTED_KEYS = ("enable_chunked_processing", "max_embed_len", "step_tag_id", "returned_token_ids")

# sentence-transformers Pooling modes -> pooling types.
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN",
             "pooling_mode_lasttoken": "LAST"}
_ST_UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                         "pooling_mode_weightedmean_tokens")


@dataclass(kw_only=True)
class PoolerConfig:
    """The engine's pooling, resolved.

    Attributes:
        task: The default task of requests that name none (``embed`` or ``classify``).
        tasks: Every task this model serves (``embed``, ``classify``, ``score``,
            ``token_embed``...).
        pooling_type: ``LAST``, ``ALL``, ``CLS`` or ``MEAN``.
        normalize: L2-normalise embeddings unless a request says otherwise.
        use_activation: Softmax (sigmoid for one label) on classifier logits by default.
        logit_bias: Subtracted from classifier logits before the activation (vLLM's).
        dimensions: Embedding size kept when a request names none (``None``: all).
        matryoshka_dimensions: The sizes a request's ``dimensions`` may take; ``None``:
            the model is not a Matryoshka model and ``dimensions`` is refused;
            ``[]``: any size up to the hidden size.
        num_labels: The classifier's outputs (0 without a classifier).
        convert: ``embed`` / ``classify`` when a causal LM is pooled, else ``none``.
        is_encoder: Bidirectional attention (BERT).
    """

    task: str = "embed"
    tasks: list[str] = field(default_factory=list)
    pooling_type: str = "LAST"
    normalize: bool = True
    use_activation: bool = True
    logit_bias: float | None = None
    dimensions: int | None = None
    matryoshka_dimensions: list[int] | None = None
    num_labels: int = 0
    convert: str = "none"
    is_encoder: bool = False


def num_labels_of(hf_config: Any) -> int:
    """A classifier's outputs: ``num_labels``, else ``id2label``'s size, else 2 (transformers').

    Args:
        hf_config: ``config.json`` as a dict, or a config object.
    """
    get = hf_config.get if isinstance(hf_config, dict) else lambda key: getattr(hf_config, key, None)
    labels = get("id2label")
    return int(get("num_labels") or (len(labels) if labels else 2))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def sentence_transformers_pooling(model_dir: Path) -> tuple[str | None, bool | None, int | None]:
    """What a sentence-transformers folder says: ``(pooling type, normalize, max_seq_length)``.

    Each is ``None`` when the folder does not say (no ``modules.json``, no Pooling module,
    no ``sentence_bert_config.json``).

    Raises:
        ValueError: A module forkless does not run (a ``Dense`` projection, a pooling mode
            other than CLS, mean or last token); the message names it.
    """
    modules = _read_json(model_dir / "modules.json")
    if not isinstance(modules, list):
        return None, None, None
    pooling_type: str | None = None
    normalize = False
    for module in modules:
        kind = str(module.get("type", ""))
        short = kind.rsplit(".", 1)[-1]
        if short == "Transformer":
            continue
        if short == "Normalize":
            normalize = True
        elif short == "Pooling":
            cfg = _read_json(model_dir / module.get("path", "") / "config.json") or {}
            on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
            bad = [k for k in on if k in _ST_UNSUPPORTED_MODES or k not in _ST_MODES]
            if bad or len(on) > 1:
                raise ValueError(f"{model_dir}: sentence-transformers pooling {on} is not supported "
                                 f"(one of {sorted(_ST_MODES)})")
            if on:
                pooling_type = _ST_MODES[on[0]]
        else:
            raise ValueError(f"{model_dir}: the sentence-transformers module {kind!r} ({module.get('path')}) "
                             "is not supported (forkless runs Transformer, Pooling and Normalize)")
    bert = _read_json(model_dir / "sentence_bert_config.json") or {}
    max_len = bert.get("max_seq_length")
    return pooling_type, normalize, int(max_len) if max_len else None


def parse_pooler_config(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """``--pooler-config`` as a dict of vLLM's keys, checked.

    Raises:
        ValueError: Not a JSON object, an unknown or unsupported key, a bad value.
    """
    if value is None:
        return {}
    value = json_object_arg(value, "--pooler-config")
    for key in value:
        if key in _UNSUPPORTED_KEYS:
            raise ValueError(f"--pooler-config: {key!r} is not supported by forkless")
        if key not in _KEYS:
            raise ValueError(f"--pooler-config: unknown key {key!r}; expected one of {', '.join(_KEYS)}")
    out = dict(value)
    if "pooling_type" in out and out["pooling_type"] is not None:
        kind = str(out["pooling_type"]).upper()
        if kind not in POOLING_TYPES:
            raise ValueError(f"--pooler-config: pooling_type {out['pooling_type']!r} is not one of "
                             f"{', '.join(POOLING_TYPES)}")
        out["pooling_type"] = kind
    for key in ("normalize", "use_activation", "activation", "softmax"):
        if key in out and out[key] is not None and not isinstance(out[key], bool):
            raise ValueError(f"--pooler-config: {key} must be true or false, got {out[key]!r}")
    dims = out.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise ValueError(f"--pooler-config: dimensions must be a positive integer, got {dims!r}")
    return out


def resolve_runner(runner: str, convert: str, pooler_config: str | dict[str, Any] | None,
                   hf: dict[str, Any], model_dir: Path, architecture: str) -> tuple[PoolerConfig | None, int | None]:
    """Decide generate or pooling, and the pooling.

    Args:
        runner: ``--runner``: ``auto`` (pooling for a pooling-only architecture or with
            ``--convert``), ``generate`` or ``pooling``.
        convert: ``--convert``: ``auto``, ``none``, ``embed`` or ``classify``.
        pooler_config: ``--pooler-config`` (JSON or dict).
        hf: The model's ``config.json``.
        model_dir: The model folder (its sentence-transformers files are read).
        architecture: The registered architecture the model runs as.

    Returns:
        ``(PoolerConfig or None for a generative model, a cap on max_model_len from
        sentence_bert_config.json or None)``.

    Raises:
        ValueError: A flag value or combination that cannot work (the message names it).
    """
    if runner not in RUNNERS:
        raise ValueError(f"--runner {runner!r}: expected one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise ValueError(f"--convert {convert!r}: expected one of {', '.join(CONVERTS)}")
    pooling_only = architecture in POOLING_ARCHS
    converts = convert in ("embed", "classify")
    if runner == "auto":
        runner = "pooling" if pooling_only or converts else "generate"
    if runner == "generate":
        if pooling_only:
            raise ValueError(f"{architecture} is a pooling model (embeddings, classification): it cannot "
                             "generate; serve it with --runner pooling (or auto)")
        if converts:
            raise ValueError(f"--convert {convert} pools a model: it needs --runner pooling (or auto)")
        if pooler_config is not None:
            raise ValueError("--pooler-config applies to pooling models: add --runner pooling")
        return None, None
    if pooling_only:
        task, default_type = POOLING_ARCHS[architecture]
        if converts and convert != task:
            raise ValueError(f"--convert {convert}: {architecture} is already a {task} model")
        convert = "none" if architecture in ENCODER_ARCHS else task
    else:
        if convert in ("auto", "none"):
            convert = "embed"  # as vLLM: a generative model run for pooling embeds
        if convert == "classify":
            raise ValueError(f"--convert classify needs a classifier head: {architecture} has none (serve a "
                             "*ForSequenceClassification checkpoint, whose 'score' weights forkless loads)")
        task, default_type = "embed", "LAST"
    st_type, st_normalize, st_max_len = sentence_transformers_pooling(model_dir)
    flags = parse_pooler_config(pooler_config)
    num_labels = num_labels_of(hf) if task == "classify" else 0
    pooling_type = flags.get("pooling_type") or st_type or default_type
    normalize = flags.get("normalize")
    if normalize is None:
        normalize = st_normalize if st_normalize is not None else True
    activation = flags.get("use_activation", flags.get("activation", flags.get("softmax")))
    matryoshka: list[int] | None = None
    if hf.get("matryoshka_dimensions"):
        matryoshka = [int(d) for d in hf["matryoshka_dimensions"]]
    elif hf.get("is_matryoshka"):
        matryoshka = []
    dims = flags.get("dimensions")
    hidden = int(hf.get("hidden_size") or 0)
    if dims is not None:
        if matryoshka is None:
            raise ValueError(f"--pooler-config: dimensions {dims}: the model is not a Matryoshka model "
                             "(its config.json has no is_matryoshka / matryoshka_dimensions)")
        if dims > hidden or (matryoshka and dims not in matryoshka):
            raise ValueError(f"--pooler-config: dimensions {dims} is not one the model allows "
                             f"({matryoshka or f'1..{hidden}'})")
    if task == "embed":
        tasks = ["embed", "score", "token_embed", "encode"]
    else:
        tasks = ["classify", "token_classify", "encode"] + (["score"] if num_labels == 1 else [])
    config = PoolerConfig(
        task=task, tasks=tasks, pooling_type=pooling_type, normalize=bool(normalize),
        use_activation=True if activation is None else bool(activation),
        logit_bias=flags.get("logit_bias"), dimensions=dims, matryoshka_dimensions=matryoshka,
        num_labels=num_labels, convert=convert, is_encoder=architecture in ENCODER_ARCHS)
    return config, st_max_len
