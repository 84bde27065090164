"""Reading the fields forkless needs from a Hugging Face config, across transformers versions.

Invariants:
    * A worker reads the config of a built-in architecture from ``config.json`` itself
      (:func:`load_hf_config`): importing transformers' config classes pulls in much of
      transformers and of torch (generation, ``torch.distributed.tensor``, ``torch._dynamo``,
      sympy), ~5-7 s of every start on the H200, for a dozen numbers. It fills what the
      file omits with the defaults of transformers' config class of that model type, and
      applies the same derivations (``head_dim``, the key/value heads, Qwen's sliding
      window switch); tests/models/test_hf_config.py compares every field the models read
      with ``AutoConfig``'s.
    * Anything else -- another model type, an architecture a plugin registered (its model
      class may expect a ``PretrainedConfig``), a file without the fields the models need
      -- is read with ``AutoConfig``, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class KVCacheSpec(NamedTuple):
    """What the KV-cache manager needs to size the cache of a decoder-only model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def get_head_dim(hf_config: "PretrainedConfig") -> int:
    """``head_dim`` from the config when set (Qwen3, Gemma...), else hidden / heads."""
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    return hf_config.hidden_size // hf_config.num_attention_heads


def get_num_kv_heads(hf_config: "PretrainedConfig") -> int:
    """``num_key_value_heads``, defaulting to the query heads (plain multi-head attention)."""
    num_kv = getattr(hf_config, "num_key_value_heads", None)
    return int(num_kv or hf_config.num_attention_heads)


def kv_cache_spec(hf_config: "PretrainedConfig") -> KVCacheSpec:
    """The KV-cache dimensions of a standard decoder-only transformer.

    Args:
        hf_config: The model's Hugging Face config.

    Returns:
        ``KVCacheSpec(num_layers, num_kv_heads, head_dim)``.
    """
    return KVCacheSpec(
        int(hf_config.num_hidden_layers), get_num_kv_heads(hf_config), get_head_dim(hf_config)
    )


def get_rope_parameters(hf_config: "PretrainedConfig") -> dict[str, Any]:
    """The rotary-embedding parameters, normalised to one flat dict.

    transformers 5 keeps everything in ``config.rope_parameters`` (``rope_theta``
    included); older versions have ``config.rope_theta`` plus an optional
    ``config.rope_scaling`` whose type key is ``rope_type`` or the legacy ``type``.

    Args:
        hf_config: The model's Hugging Face config.

    Returns:
        A dict with at least ``rope_type`` and ``rope_theta`` (plus the type's own
        parameters such as ``factor``); ``partial_rotary_factor`` when the config has one.
    """
    params: dict[str, Any] = {}
    scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params.update(scaling)
    new_style = getattr(hf_config, "rope_parameters", None)
    if isinstance(new_style, dict):
        params.update(new_style)
    if "rope_theta" not in params:
        params["rope_theta"] = float(getattr(hf_config, "rope_theta", None) or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = rope_type
    if "partial_rotary_factor" not in params:
        factor = getattr(hf_config, "partial_rotary_factor", None)
        if factor is not None:
            params["partial_rotary_factor"] = float(factor)
    return params


# transformers' defaults, per model type, for the fields forkless's models read (the
# values of LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config's signatures).
_COMMON_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
    "rope_scaling": None, "head_dim": None, "attention_bias": False,
}
_JSON_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON_DEFAULTS, "max_position_embeddings": 2048, "mlp_bias": False, "num_key_value_heads": None},
    "mistral": {**_COMMON_DEFAULTS, "max_position_embeddings": 4096 * 32, "sliding_window": 4096,
                "num_key_value_heads": 8},
    "qwen2": {**_COMMON_DEFAULTS, "max_position_embeddings": 32768, "use_sliding_window": False,
              "sliding_window": 4096, "num_key_value_heads": 32},
    "qwen3": {**_COMMON_DEFAULTS, "max_position_embeddings": 32768, "use_sliding_window": False,
              "sliding_window": 4096, "num_key_value_heads": 32, "head_dim": 128},
    # BertConfig's; num_labels follows id2label as in PretrainedConfig (2 without one).
    "bert": {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
             "type_vocab_size": 2, "position_embedding_type": "absolute", "pad_token_id": 0,
             "head_dim": None, "num_key_value_heads": None, "tie_word_embeddings": True},
}
# Fields a config.json must have to be read without transformers (its defaults for them
# are a reference model's, never what a real checkpoint means).
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


class JsonHFConfig:
    """A Hugging Face config read from ``config.json`` (see :func:`load_hf_config`).

    Every key of the file is an attribute, after the model type's defaults; missing
    attributes raise ``AttributeError`` as on a ``PretrainedConfig``, so ``getattr(config,
    name, default)`` behaves the same.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.__dict__.update(_JSON_CONFIG_DEFAULTS[data["model_type"]])
        self.__dict__.update(data)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.model_type in ("qwen2", "qwen3") and not self.use_sliding_window:
            self.sliding_window = None
        if "num_labels" not in data and self.model_type == "bert":
            labels = data.get("id2label")
            self.num_labels = len(labels) if isinstance(labels, dict) else 2

    def to_dict(self) -> dict[str, Any]:
        """The fields, as a new dict."""
        return dict(self.__dict__)

    def get_text_config(self, **_: Any) -> "JsonHFConfig":
        """The text model's config: this one (these are text-only models)."""
        return self

    def __repr__(self) -> str:
        return f"JsonHFConfig({self.__dict__})"


def load_hf_config(model_dir: str | Path) -> Any:
    """A model folder's config, for building the model in a worker.

    Read from ``config.json`` directly when every architecture it names is a built-in
    forkless model of a known model type, else with transformers' ``AutoConfig`` (see the
    module's invariants).

    Args:
        model_dir: The model folder.

    Returns:
        A :class:`JsonHFConfig` or a ``transformers.PretrainedConfig``.
    """
    from forkless.models.registry import ModelRegistry

    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    archs = data.get("architectures") if isinstance(data, dict) else None
    if (isinstance(archs, list) and archs and data.get("model_type") in _JSON_CONFIG_DEFAULTS
            and all(k in data for k in _REQUIRED)
            and all((ModelRegistry.get_path(a) or "").startswith("forkless.models.") for a in archs)):
        return JsonHFConfig(data)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)
