"""The forkless extension system: plugin loading, lazy registries, stability tiers.

Nothing here imports torch or any other heavy module: every process loads this first.
"""

from forkless.plugins._deprecation import (
    DEPRECATIONS,
    DeprecatedError,
    Deprecation,
    DeprecationKind,
    DeprecationRegistry,
)
from forkless.plugins._loader import (
    ENDPOINT_PLUGINS_GROUP,
    GENERAL_PLUGINS_GROUP,
    GROUPS,
    IO_PROCESSOR_PLUGINS_GROUP,
    LOGITS_PROCESSOR_GROUP,
    PLATFORM_PLUGINS_GROUP,
    STAT_LOGGER_PLUGINS_GROUP,
    PluginLoadError,
    PluginRecord,
    call_plugin,
    installed_entry_points,
    load_general_plugins,
    load_plugins_by_group,
    plugin_records,
)
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
    "DEPRECATIONS",
    "DeprecatedError",
    "Deprecation",
    "DeprecationKind",
    "DeprecationRegistry",
    "ENDPOINT_PLUGINS_GROUP",
    "GENERAL_PLUGINS_GROUP",
    "GROUPS",
    "IO_PROCESSOR_PLUGINS_GROUP",
    "LOGITS_PROCESSOR_GROUP",
    "LazyRegistry",
    "PLATFORM_PLUGINS_GROUP",
    "PluginImportError",
    "PluginLoadError",
    "PluginRecord",
    "RegistryError",
    "STAT_LOGGER_PLUGINS_GROUP",
    "Stability",
    "all_registries",
    "call_plugin",
    "canonical_path",
    "import_path",
    "installed_entry_points",
    "load_general_plugins",
    "load_plugins_by_group",
    "plugin_records",
    "resolve_class",
    "snapshot_all",
    "stability",
    "tier_of",
]
