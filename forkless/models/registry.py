"""``ModelRegistry``: architecture name (``config.json`` ``architectures``) -> model class.

Built-ins are registered by path, so nothing is imported until a worker builds a model.
This module must stay import-light: the API server and the plugin loader import it.
"""

from __future__ import annotations

from typing import Any, Sequence

from forkless.plugins import LazyRegistry, PluginImportError

_BUILTIN_MODELS = {
    "LlamaForCausalLM": "forkless.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "forkless.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "forkless.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "forkless.models.qwen3:Qwen3ForCausalLM",
    # Pooling models (--runner pooling; forkless.pooling.config says which task each serves).
    "BertModel": "forkless.models.bert:BertModel",
    "BertForSequenceClassification": "forkless.models.bert:BertForSequenceClassification",
    "LlamaForSequenceClassification": "forkless.models.seq_cls:LlamaForSequenceClassification",
    "MistralForSequenceClassification": "forkless.models.seq_cls:LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification": "forkless.models.seq_cls:Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification": "forkless.models.seq_cls:Qwen3ForSequenceClassification",
}


class UnsupportedArchitectureError(ValueError):
    """No registered model class matches the model's ``architectures``."""


class _ModelRegistry:
    """The model-architecture registry (public tier)."""

    def __init__(self) -> None:
        self._registry: LazyRegistry[Any] = LazyRegistry(
            "model architecture",
            hint="Register one with ModelRegistry.register_model(arch, 'pkg.mod:Class') "
            "from a forkless.general_plugins entry point.",
        )
        for arch, path in _BUILTIN_MODELS.items():
            self._registry.register(arch, path)

    def register_model(self, arch: str, model_cls: Any) -> None:
        """Register a model class for an architecture name.

        Args:
            arch: The name as written in ``config.json`` ``architectures``.
            model_cls: ``"pkg.mod:Class"`` (preferred: imported only where the model is
                built) or the class itself.
        """
        self._registry.register(arch, model_cls)

    def get_supported_archs(self) -> list[str]:
        """The registered architecture names, sorted."""
        return self._registry.names()

    def is_registered(self, arch: str) -> bool:
        return arch in self._registry

    def is_imported(self, arch: str) -> bool:
        """Whether the class for ``arch`` has been imported in this process."""
        return self._registry.is_imported(arch)

    def get_path(self, arch: str) -> str | None:
        return self._registry.get_path(arch)

    def resolve_model_cls(self, architectures: Sequence[str] | str) -> tuple[Any, str]:
        """Import and return the class for the first supported architecture.

        Args:
            architectures: ``config.json``'s ``architectures`` list (or one name).

        Returns:
            ``(model_class, architecture_name)``.

        Raises:
            UnsupportedArchitectureError: None is registered (the message, worded as
                vLLM's, lists the supported architectures and says how to add one with a
                plugin), or a registered class fails to import (the message names its
                path and the import error).
        """
        if isinstance(architectures, str):
            architectures = [architectures]
        archs = list(architectures or [])
        for arch in archs:
            if arch in self._registry:
                try:
                    return self._registry.resolve(arch), arch
                except (PluginImportError, TypeError) as exc:
                    raise UnsupportedArchitectureError(
                        f"Model architectures {archs} failed to be inspected: {arch!r} is "
                        f"registered as {self._registry.get_path(arch)!r}, which fails: {exc}"
                    ) from exc
        raise UnsupportedArchitectureError(
            f"Model architectures {archs} are not supported for now. Supported "
            f"architectures: {self.get_supported_archs()}. To add one, register it from a "
            "plugin: ModelRegistry.register_model('MyArch', 'my_pkg.model:MyModel') in a "
            "forkless.general_plugins entry point (see docs/plugins.md)."
        )


ModelRegistry = _ModelRegistry()
