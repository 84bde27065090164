"""A KV connector written as vLLM's (``vllm`` renamed ``forkless`` in the imports, nothing
else): it records, on its worker side, what its scheduler side saw of each step through
vLLM's views (``scheduled_new_reqs``, ``scheduled_cached_reqs``, ``KVCacheBlocks``), and
answers a request that came with ``kv_transfer_params`` as a prefill engine of vLLM's
answers its decode engine: with the blocks it holds and what the client sent."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from forkless.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                     KVConnectorRole)


@dataclass
class StepMeta(KVConnectorMetadata):
    new: list[list[Any]] = field(default_factory=list)  # [req_id, prompt length, block ids, computed]
    cached: list[str] = field(default_factory=list)
    allocated: dict[str, list[int]] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)


class RecordingConnector(KVConnectorBase_V1):
    metadata_cls = StepMeta

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._block_size = self._vllm_config.cache_config.block_size
        self._path = self._kv_transfer_config.get_from_extra_config("record_path", None)
        self._allocated: dict[str, list[int]] = {}

    # -- scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._allocated[request.request_id] = list(blocks.get_block_ids()[0])

    def build_connector_meta(self, scheduler_output: Any) -> StepMeta:
        meta = StepMeta(tokens=dict(scheduler_output.num_scheduled_tokens))
        for new_req in scheduler_output.scheduled_new_reqs:
            meta.new.append([new_req.req_id, len(new_req.prompt_token_ids), list(new_req.block_ids[0]),
                             new_req.num_computed_tokens])
        meta.cached = list(scheduler_output.scheduled_cached_reqs.req_ids)
        meta.allocated, self._allocated = self._allocated, {}
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if request.kv_transfer_params is None:
            return False, None
        return False, {"remote_block_ids": list(block_ids), "remote_engine_id": "recorder",
                       "asked": request.kv_transfer_params}

    # -- worker side
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if meta.new or meta.cached:
            with open(self._path, "a") as f:
                f.write(json.dumps({"new": meta.new, "cached": meta.cached, "allocated": meta.allocated,
                                    "tokens": meta.tokens}) + "\n")

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass
