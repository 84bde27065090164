"""The forkless extension system: plugin loading, lazy registries, stability tiers.

Invariants:
    * Nothing here imports torch or any other heavy module: every process loads this first.
    * This package's public names are the ones in ``__all__``; other forkless packages
      import from ``forkless.plugins``, never from its ``_private`` modules.
"""

from forkless.plugins._deprecation import (
    DEPRECATIONS,
    DeprecatedError,
    Deprecation,
    DeprecationKind,
    DeprecationRegistry,
)
from forkless.plugins._loader import (
    DEFAULT_PLUGINS_GROUP,
    ENDPOINT_PLUGINS_GROUP,
    GENERAL_PLUGINS_GROUP,
    GROUPS,
    IO_PROCESSOR_PLUGINS_GROUP,
    LOGITS_PROCESSOR_GROUP,
    PLATFORM_PLUGINS_GROUP,
    STAT_LOGGER_PLUGINS_GROUP,
    GroupSpec,
    PluginLoadError,
    PluginRecord,
    PluginSelection,
    ValueKind,
    call_plugin,
    call_plugins_by_group,
    installed_entry_points,
    load_general_plugins,
    load_plugins_by_group,
    plugin_records,
    plugin_selection,
    reject_plugin,
    strict_mode,
    unknown_group_message,
)
from forkless.plugins._discovery import vllm_group_hint
from forkless.plugins._parser_manager import ParserManager
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
    "DEFAULT_PLUGINS_GROUP",
    "DEPRECATIONS",
    "DeprecatedError",
    "Deprecation",
    "DeprecationKind",
    "DeprecationRegistry",
    "ENDPOINT_PLUGINS_GROUP",
    "GENERAL_PLUGINS_GROUP",
    "GROUPS",
    "GroupSpec",
    "IO_PROCESSOR_PLUGINS_GROUP",
    "LOGITS_PROCESSOR_GROUP",
    "LazyRegistry",
    "PLATFORM_PLUGINS_GROUP",
    "ParserManager",
    "PluginImportError",
    "PluginLoadError",
    "PluginRecord",
    "PluginSelection",
    "RegistryError",
    "STAT_LOGGER_PLUGINS_GROUP",
    "Stability",
    "ValueKind",
    "all_registries",
    "call_plugin",
    "call_plugins_by_group",
    "canonical_path",
    "import_path",
    "installed_entry_points",
    "load_general_plugins",
    "load_plugins_by_group",
    "plugin_records",
    "plugin_selection",
    "resolve_class",
    "snapshot_all",
    "stability",
    "reject_plugin",
    "strict_mode",
    "unknown_group_message",
    "tier_of",
    "vllm_group_hint",
]
