"""The forkless extension system: plugin loading, lazy registries, stability tiers.

Nothing here imports torch or any other heavy module: every process loads this first.
"""

from forkless.plugins._registry import (
    LazyRegistry,
    PluginImportError,
    RegistryError,
    all_registries,
    canonical_path,
    import_path,
    snapshot_all,
)
from forkless.plugins._stability import Stability, resolve_class, stability, tier_of

__all__ = [
    "LazyRegistry",
    "PluginImportError",
    "RegistryError",
    "Stability",
    "all_registries",
    "canonical_path",
    "import_path",
    "resolve_class",
    "snapshot_all",
    "stability",
    "tier_of",
]
