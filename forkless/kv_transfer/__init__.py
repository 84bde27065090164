"""KV connectors: share and move the KV cache between engines (provisional tier).

Public names (``docs/plugins.md``, "KV connectors"):
    ``KVConnectorBase``, ``KVConnectorRole``, ``KVConnectorMetadata``, ``ForwardContext``
    (``interface``); ``KVConnectorFactory`` (``registry``); ``KVTransferConfig``
    (``config``); ``BlockStoreConnector`` (``block_store``: a connector over any key ->
    bytes store of whole blocks); ``KVConnectorBase_V1`` is vLLM's name of the base class.
    The built-ins, ``SharedStorageConnector`` and
    ``RedisConnector``, are imported only when selected.
"""

from forkless.kv_transfer.block_store import BlockStoreConnector
from forkless.kv_transfer.config import KVTransferConfig
from forkless.kv_transfer.interface import (BlockIds, ForwardContext, KVConnectorBase, KVConnectorMetadata,
                                            KVConnectorRole)
from forkless.kv_transfer.registry import KVConnectorFactory

#: vLLM's name (``vllm.distributed.kv_transfer.kv_connector.v1.base``).
KVConnectorBase_V1 = KVConnectorBase

__all__ = [
    "BlockIds",
    "BlockStoreConnector",
    "ForwardContext",
    "KVConnectorBase",
    "KVConnectorBase_V1",
    "KVConnectorFactory",
    "KVConnectorMetadata",
    "KVConnectorRole",
    "KVTransferConfig",
]
