"""KV connectors: share and move the KV cache between engines (provisional tier).

Public names (``docs/plugins.md``, "KV connectors"):
    ``KVConnectorBase``, ``KVConnectorRole``, ``KVConnectorMetadata``, ``ForwardContext``
    (``interface``); ``KVConnectorFactory`` (``registry``); ``KVTransferConfig``
    (``config``); ``BlockStoreConnector`` (``block_store``: a connector over any key ->
    bytes store of whole blocks). The built-ins, ``SharedStorageConnector`` and
    ``RedisConnector``, are imported only when selected.
"""

from forkless.kv_transfer.block_store import BlockStoreConnector
from forkless.kv_transfer.config import KVTransferConfig
from forkless.kv_transfer.interface import ForwardContext, KVConnectorBase, KVConnectorMetadata, KVConnectorRole
from forkless.kv_transfer.registry import KVConnectorFactory

__all__ = [
    "BlockStoreConnector",
    "ForwardContext",
    "KVConnectorBase",
    "KVConnectorFactory",
    "KVConnectorMetadata",
    "KVConnectorRole",
    "KVTransferConfig",
]
