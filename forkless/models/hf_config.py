"""Reading the fields forkless needs from a Hugging Face config, across transformers versions."""

from __future__ import annotations

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
