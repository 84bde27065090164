"""A KV connector's worker side, wired into the model runner's step.

Invariants:
    * Every step goes through :meth:`WorkerKVConnector.begin` before the forward pass and
      :meth:`WorkerKVConnector.end` after it, a step without scheduled requests too (it
      may still start loads, and finished transfers are reported in any step).
    * The layer hooks (``wait_for_layer_load`` before an attention layer,
      ``save_kv_layer`` after it) run only while a step's metadata is bound, never in a
      profiling run or a CUDA-graph capture; a replayed graph skips them, which is why a
      connector that needs them in decode steps turns graphs off
      (``requires_layer_hooks_in_decode``).
    * Layer names are the attention backends' module paths
      (``model.layers.0.self_attn.attn``), in the order of the model's KV-cache list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forkless.attention import AttentionBackend, attention_layers
from forkless.kv_transfer.interface import ForwardContext, KVConnectorRole
from forkless.kv_transfer.registry import KVConnectorFactory
from forkless.protocol.kv_transfer import KVConnectorOutput, decode_connector_metadata

if TYPE_CHECKING:
    import torch

    from forkless.config import EngineConfig
    from forkless.kv_transfer.interface import KVConnectorBase
    from forkless.protocol.step import SchedulerOutput


class WorkerKVConnector:
    """The configured connector's worker side, with the cache registered and the
    attention layers hooked.

    Args:
        config: The engine configuration (``kv_transfer_config`` set).
        model: The loaded model.
        kv_caches: Its per-layer caches, in layer order.

    Raises:
        ValueError: The model's attention layers do not match its caches one for one.
    """

    def __init__(self, config: EngineConfig, model: Any, kv_caches: list[torch.Tensor]) -> None:
        self.connector: KVConnectorBase = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER)
        layers = attention_layers(model)
        if len(layers) != len(kv_caches):
            raise ValueError(f"KV connectors need one attention backend per KV-cache layer; the model has "
                             f"{len(layers)} backends for {len(kv_caches)} caches")
        self.kv_caches = {name: cache for (name, _), cache in zip(layers, kv_caches)}
        self.connector.register_kv_caches(self.kv_caches)
        for name, backend in layers:
            _hook(backend, name, self.connector)

    @property
    def requires_layer_hooks_in_decode(self) -> bool:
        """Whether decode steps must run eagerly (see ``KVConnectorBase``)."""
        return type(self.connector).requires_layer_hooks_in_decode

    def begin(self, scheduler_output: SchedulerOutput) -> None:
        """Bind the step's metadata and start its loads (before the forward pass)."""
        if scheduler_output.kv_connector_metadata is None:
            return
        connector = self.connector
        meta = decode_connector_metadata(scheduler_output.kv_connector_metadata, type(connector).metadata_cls)
        connector.bind_connector_metadata(meta)
        connector.handle_preemptions(meta)
        connector.start_load_kv(ForwardContext(self.kv_caches))

    def end(self, scheduler_output: SchedulerOutput) -> KVConnectorOutput:
        """Finish the step's saves and collect what ended (after the forward pass)."""
        connector = self.connector
        try:
            if connector.has_connector_metadata():
                connector.wait_for_save()
            sending, recving = connector.get_finished(set(scheduler_output.finished_request_ids))
            errors = connector.get_block_ids_with_load_errors()
            stats = connector.get_kv_connector_stats()
        finally:
            connector.clear_connector_metadata()
        return KVConnectorOutput(finished_sending=sorted(sending or ()), finished_recving=sorted(recving or ()),
                                 invalid_block_ids=sorted(errors), stats=stats)

    def wait_for_pending_saves(self) -> None:
        """Let every save the connector started end (before its store is reset)."""
        self.connector.wait_for_pending_saves()

    def shutdown(self) -> None:
        """Stop the connector's threads and connections."""
        self.connector.shutdown()


def _hook(backend: AttentionBackend, layer_name: str, connector: KVConnectorBase) -> None:
    """Make ``backend.forward`` call the connector's layer hooks around the attention."""
    forward = backend.forward

    def hooked(q: Any, k: Any, v: Any, kv_cache: Any, attn_metadata: Any) -> Any:
        if kv_cache is None or not kv_cache.numel() or not connector.has_connector_metadata():
            return forward(q, k, v, kv_cache, attn_metadata)
        connector.wait_for_layer_load(layer_name)
        out = forward(q, k, v, kv_cache, attn_metadata)
        connector.save_kv_layer(layer_name, kv_cache, attn_metadata)
        return out

    backend.forward = hooked  # type: ignore[method-assign]
