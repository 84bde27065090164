"""Import paths that are other names of forkless modules: vLLM's paths, and forkless's old ones.

A plugin written for vLLM ports by renaming ``vllm`` to ``forkless`` in its imports, so
``forkless.v1.sample.logits_processor.builtin`` must import. Each path in :data:`ALIASES`
names a forkless module, and so does every path beneath it, by the same relative name
(``forkless.v1.sample.logits_processor.interface`` is ``forkless.logits_processors.interface``).

Invariants:
    * An alias *is* its module (one object in ``sys.modules`` under both names), never a
      copy: a class imported through a vLLM path is the class forkless checks against,
      and no module body runs twice. (Swapping ``sys.modules`` in an alias file, as this
      replaces, got that wrong for submodules: the import system then loaded
      ``...logits_processor.interface`` from the target's folder as a second module,
      with a second ``LogitsProcessor`` class.)
    * :func:`install` puts one finder first on ``sys.meta_path``; ``import forkless``
      calls it, so it is in place before any alias can be imported. The finder imports
      nothing until an alias is imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

#: Alias path -> the forkless module it names.
ALIASES: dict[str, str] = {
    # vLLM's paths (``vllm`` renamed).
    "forkless.v1.sample.logits_processor": "forkless.logits_processors",
    "forkless.v1.metrics.loggers": "forkless.metrics",
    "forkless.v1.metrics.stats": "forkless.metrics.stats",
    "forkless.entrypoints.openai.protocol": "forkless.protocol.openai",
    "forkless.entrypoints.openai.engine.protocol": "forkless.protocol.openai",
    "forkless.entrypoints.openai.chat_completion.protocol": "forkless.protocol.openai",
    "forkless.entrypoints.generate.base.protocol": "forkless.protocol.openai",
    "forkless.entrypoints.openai.tool_parsers": "forkless.tool_parsers",
    "forkless.lora.request": "forkless.protocol.lora",
    "forkless.lora.resolver": "forkless.lora",
    "forkless.model_executor.models": "forkless.models",
    "forkless.model_executor.custom_op": "forkless.ops.interface",
    "forkless.model_executor.layers": "forkless.ops",
    "forkless.model_executor.layers.rotary_embedding": "forkless.ops.rotary",
    "forkless.plugins.io_processors": "forkless.io_processors",
    "forkless.distributed.kv_transfer": "forkless.kv_transfer",
    "forkless.distributed.kv_transfer.kv_connector": "forkless.kv_transfer",
    "forkless.distributed.kv_transfer.kv_connector.v1": "forkless.kv_transfer",
    "forkless.distributed.kv_transfer.kv_connector.v1.base": "forkless.kv_transfer",
    "forkless.distributed.kv_transfer.kv_connector.factory": "forkless.kv_transfer",
    "forkless.forward_context": "forkless.kv_transfer",
    "forkless.v1.core": "forkless.core",
    "forkless.v1.engine": "forkless.engine",
    "forkless.engine.arg_utils": "forkless.config",
    "forkless.transformers_utils": "forkless.tokenizers",
    "forkless.transformers_utils.tokenizer": "forkless.tokenizers",
    # (the parents are packages, so that their children can be imported)
    "forkless.entrypoints.pooling": "forkless.pooling",
    "forkless.entrypoints.pooling.pooling": "forkless.pooling",
    "forkless.entrypoints.pooling.pooling.protocol": "forkless.protocol.pooling",
    "forkless.v1.request": "forkless.core.request",
    "forkless.logprobs": "forkless.outputs",  # vLLM's Logprob, SampleLogprobs, PromptLogprobs
    # vLLM 0.32 moved the chat helpers (make_tool_call_id) to vllm.renderers.chat_utils.
    "forkless.renderers": "forkless.entrypoints",
    # The built-in parsers' modules under vLLM's file names: a plugin that subclasses one
    # (a reasoning parser of other think tags, say) imports it from there.
    "forkless.reasoning.deepseek_r1_reasoning_parser": "forkless.reasoning.deepseek_r1",
    "forkless.reasoning.qwen3_reasoning_parser": "forkless.reasoning.qwen3",
    "forkless.reasoning.qwen3_engine_reasoning_parser": "forkless.reasoning.qwen3",  # vLLM 0.32's name
    "forkless.tool_parsers.hermes_tool_parser": "forkless.tool_parsers.hermes",
    "forkless.tool_parsers.llama_tool_parser": "forkless.tool_parsers.llama3_json",
    # forkless's own earlier paths.
    "forkless.core.sched.output": "forkless.protocol.step",
    "forkless.engine.protocol": "forkless.protocol.engine",
    "forkless.engine.ipc": "forkless.protocol.ipc",
}

#: vLLM paths (``vllm`` renamed) with no forkless counterpart, and what to use instead. A
#: ported plugin that imports one (or a module beneath it) gets this in its
#: ``ModuleNotFoundError``: the missing module's name alone gave a porter nothing to go on.
UNSUPPORTED: dict[str, str] = {
    # Python imports the parents first, so the hint must be on the package that fails
    # first: vLLM's Model Runner V2 logits processors live under it.
    "forkless.v1.worker": (
        "forkless has none of vLLM's worker modules (its worker is forkless.worker.worker:Worker); "
        "a logits processor written for vLLM's Model Runner V2 interface "
        "(vllm.v1.worker.gpu.sample.logits_processor: apply(logits, ctx), add_request) does not "
        "port: write it against vLLM's v1 interface, forkless.v1.sample.logits_processor."
        "LogitsProcessor (update_state(batch_update), apply(logits), is_argmax_invariant())"
    ),
}

# Longest first, so that a nested alias wins over its parent's.
_BY_LENGTH = sorted(ALIASES, key=len, reverse=True)


def target_of(name: str) -> str | None:
    """The forkless module that the module path ``name`` names, or ``None`` when it is no alias."""
    for alias in _BY_LENGTH:
        if name == alias or name.startswith(alias + "."):
            return ALIASES[alias] + name[len(alias):]
    return None


class _AliasFinder:
    """Finds an alias path and loads it as the module it names (importing that one)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith("forkless."):
            return None
        for prefix, hint in UNSUPPORTED.items():
            if name == prefix or name.startswith(prefix + "."):
                raise ModuleNotFoundError(f"No module named {name!r}: {hint}", name=name)
        if target_of(name) is None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        real = target_of(spec.name)
        assert real is not None
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as exc:
            if exc.name != real:
                raise
            # Beneath an alias, but no forkless module there: name the path the plugin
            # imported, not the forkless one it was mapped to (which it never wrote).
            raise ModuleNotFoundError(
                f"No module named {spec.name!r}: forkless has no counterpart of this vLLM module "
                f"(forkless/module_aliases.py lists the vLLM paths it has; docs/plugins.md, section 9)",
                name=spec.name) from None
        # The import system keeps a module's own __name__, __loader__ and __path__ (it
        # fills only what is missing) but sets __spec__ to the alias's: keep the module's
        # own to put back in exec_module.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Run nothing (the module was imported by :meth:`create_module`); give it back its own spec."""
        alias_spec = module.__spec__
        if alias_spec is not None and alias_spec.loader is self:
            module.__spec__ = alias_spec.loader_state


_FINDER = _AliasFinder()


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FINDER)
