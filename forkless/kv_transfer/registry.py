"""``KVConnectorFactory``: KV connectors by name, imported on first use.

``--kv-transfer-config``'s ``kv_connector`` is a name registered here (the built-ins, or
one a general plugin registers with :meth:`KVConnectorFactory.register_connector`), or,
with ``kv_connector_module_path``, a class of that module (which then wins over a
registered name). An unknown name is an error
listing the registered ones.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forkless.kv_transfer.interface import KVConnectorBase, KVConnectorRole
from forkless.logger import init_logger
from forkless.plugins import LazyRegistry, PluginImportError, resolve_class

if TYPE_CHECKING:
    from forkless.core.sched.config import KVCacheConfig
    from forkless.kv_transfer.config import KVTransferConfig

logger = init_logger(__name__)

_BUILTIN_CONNECTORS = {
    "SharedStorageConnector": "forkless.kv_transfer.shared_storage:SharedStorageConnector",
    # vLLM 0.32's name for the same connector (its SharedStorageConnector was renamed).
    "ExampleConnector": "forkless.kv_transfer.shared_storage:SharedStorageConnector",
    "RedisConnector": "forkless.kv_transfer.redis_store:RedisConnector",
}

# The provisional-interface notice is logged once per process.
_announced = False


class _KVConnectorFactory:
    """Named KV connectors (provisional tier)."""

    def __init__(self) -> None:
        self._registry: LazyRegistry[type[KVConnectorBase]] = LazyRegistry(
            "KV connector", KVConnectorBase,
            "Register one with forkless.kv_transfer.KVConnectorFactory.register_connector(name, module_path, "
            "class_name) from a general plugin, or give kv_connector_module_path.")
        for name, path in _BUILTIN_CONNECTORS.items():
            self._registry.register(name, path)

    def register_connector(self, name: str, module_path: str, class_name: str) -> None:
        """Register ``module_path.class_name`` as connector ``name`` (imported on first use).

        Raises:
            ValueError: An empty name or a malformed path.
        """
        self._registry.register(name, f"{module_path}:{class_name}")

    def get_supported_connectors(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._registry.names())

    def get_connector_class(self, kv_transfer_config: KVTransferConfig) -> type[KVConnectorBase]:
        """The class ``kv_transfer_config`` names.

        Raises:
            ValueError: An unknown name (the message lists the registered ones), a module
                that does not import, or a class that is not a ``KVConnectorBase`` with
                every abstract method implemented.
        """
        name = kv_transfer_config.kv_connector
        module_path = kv_transfer_config.kv_connector_module_path
        where = f"--kv-transfer-config: kv_connector {name!r}"
        try:
            if module_path is None:
                return self._registry.resolve(name)
            # A module path given is used even when the name is also registered (it is
            # the more explicit of the two, and is never silently passed over).
            try:
                cls = getattr(importlib.import_module(module_path), name)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"{where} from kv_connector_module_path {module_path!r} does not import: "
                                 f"{exc}") from None
        except (KeyError, PluginImportError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        try:
            resolve_class(cls, KVConnectorBase, f"{where} in {module_path!r}")
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        return cls

    def create_connector(self, config: Any, role: KVConnectorRole,
                         kv_cache_config: KVCacheConfig | None = None) -> KVConnectorBase:
        """Build the configured connector's ``role`` side.

        Raises:
            ValueError: The connector cannot be resolved (see :meth:`get_connector_class`).
        """
        global _announced
        assert config.kv_transfer_config is not None
        cls = self.get_connector_class(config.kv_transfer_config)
        if not _announced:
            _announced = True
            logger.warning("KV connector %s (%s): the KV connector interface is provisional (experimental) and "
                           "may change in a minor release", config.kv_transfer_config.kv_connector,
                           config.kv_transfer_config.kv_role)
        return cls(config, role, kv_cache_config)


KVConnectorFactory = _KVConnectorFactory()

