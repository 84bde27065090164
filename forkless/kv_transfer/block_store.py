"""Connectors over a store of KV-cache blocks keyed by the prefix-block hash chain.

A full block's key is the SHA-256 chain hash of every token up to and including it (the
prefix cache's own ``sha256`` hash, ``forkless.core.block_pool``), under a namespace that
names the model (its served name), dtypes and block size. So a key says everything its KV depends on, any
engine of the same model that finds the key may use the block, and a lookup walks the
request's blocks in order and stops at the first key the store lacks.

A subclass supplies the store: :meth:`BlockStoreConnector.contains`,
:meth:`BlockStoreConnector.get` and :meth:`BlockStoreConnector.put`, and says whether it
loads and saves on a background thread (:attr:`BlockStoreConnector.load_async`,
:attr:`BlockStoreConnector.save_async`); :meth:`BlockStoreConnector.clear` (optional)
deletes its namespace's blocks, for ``reset_prefix_cache(reset_connector=True)``.

Invariants:
    * Only prompt blocks are saved, once each, by the step that completes them; the
      request's last prompt token is never loaded (its logits give the first output).
    * A stored block is the bytes of one safetensors file holding one tensor, all layers'
      keys and values of the block (``[layers, 2, block_size, kv_heads, head_dim]``),
      with the key and a CRC-32 of the tensor in its metadata: a load checks the key,
      the shape, the dtype and the checksum, so a corrupt, truncated, foreign or missing
      block is reported (``get_block_ids_with_load_errors``) and recomputed, never used.
    * With ``-tp`` / ``-pp`` each rank stores its own part of a block (its KV heads of its
      stage's layers), under the block's key followed by ``.r<rank>`` (the namespace names
      the split: a block split another way is another block); a lookup finds a block only
      when every rank's part is there.
    * A store that fails (unreachable, full, corrupt) never fails a request: a failed
      lookup finds nothing, a failed save is dropped, a failed load is recomputed; each
      is logged (at most once per 10 s per kind).
    * A lookup runs on the scheduler's thread, so a store that does not answer would hold
      every step for its timeout, once per admitted request: after a failed lookup the
      store is not asked again for 1 s, then 2, 4... up to 30 s while it keeps failing
      (those requests compute their prompts); the first lookup that succeeds ends it.
    * A save copies its blocks out of the cache and encodes them right after the step,
      on the step's thread (CPU work, ~1 ms a block, that a background thread would only
      fight the forward pass's threads for); with ``save_async`` only the write to the
      store runs on a thread. The request still keeps its blocks until the write ends
      (``request_finished`` returns True, the worker reports it in ``finished_sending``),
      and a preempted request's writes end before the next forward pass, so that a
      request's KV is in the store, or dropped, before anything of it is reused.
    * A reset (``reset_cache``) deletes only this namespace's blocks -- those of this
      model, dtypes, block size and split -- after every worker's writes in flight have
      ended (``wait_for_pending_saves``); the connector keeps no index of what is stored,
      so the store itself is what a later lookup asks.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import json
import math
import threading
import time
import zlib
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from forkless.core.block_pool import extend_block_hashes
from forkless.kv_transfer.interface import ForwardContext, KVConnectorBase, KVConnectorMetadata, KVConnectorRole
from forkless.logger import init_logger
from forkless.protocol.kv_transfer import KVTransferStats

if TYPE_CHECKING:
    import torch

    from forkless.attention.interface import AttentionMetadata
    from forkless.core.request import Request
    from forkless.core.sched.config import KVCacheConfig
    from forkless.protocol.step import SchedulerOutput

logger = init_logger(__name__)

_WARN_EVERY_S = 10.0
# Seconds lookups skip the store after one fails, doubled per failure in a row up to the last.
_LOOKUP_BACKOFF_S = (1.0, 30.0)


@functools.cache
def _dtype_names() -> dict[Any, str]:
    """safetensors' name of each cache dtype (the header's ``dtype``)."""
    import torch

    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


@dataclass
class BlockTransfer:
    """Blocks of one request to load or save, in token order.

    Attributes:
        request_id: The request.
        keys: The blocks' store keys.
        block_ids: The KV-cache blocks they go to or come from.
    """

    request_id: str
    keys: list[str]
    block_ids: list[int]


@dataclass
class BlockStoreMetadata(KVConnectorMetadata):
    """One step's transfers.

    Attributes:
        loads: Blocks to load (before the forward pass, or started then with ``load_async``).
        saves: Prompt blocks this step computes, to save after it.
        preempted: Requests preempted by this step: their saves must end before it runs.
    """

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)


class BlockLoadError(Exception):
    """A stored block cannot be used (missing, corrupt, or of another shape)."""


class BlockStoreConnector(KVConnectorBase):
    """A KV connector over a key -> bytes store of whole blocks (provisional).

    Attributes:
        load_async: Load on a background thread between steps (the request waits in
            ``WAITING_FOR_REMOTE_KVS``) rather than before the step's forward pass.
        save_async: Save on a background thread after the step rather than in
            ``wait_for_save``.
        store_name: What the store is, for log messages.
    """

    metadata_cls = BlockStoreMetadata
    # Only prompt blocks move, all of it in start_load_kv / wait_for_save: decode steps
    # (and their CUDA graphs) never need the layer hooks.
    requires_layer_hooks_in_decode = False
    load_async: ClassVar[bool] = False
    save_async: ClassVar[bool] = False
    store_name: ClassVar[str] = "block store"

    def __init__(self, config: Any, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(config, role, kv_cache_config)
        self.block_size = config.cache_config.block_size
        self.namespace = store_namespace(config)
        # -tp / -pp: the ranks' parts of a block, and the suffix of this rank's keys (worker side).
        self.num_ranks = config.parallel_config.world_size
        self._key_suffix = ""
        if role == KVConnectorRole.WORKER and self.num_ranks > 1:
            from forkless.distributed.parallel_state import get_world_group

            self._key_suffix = f".r{get_world_group().rank_in_group}"
        ktc = self._kv_transfer_config
        self.is_producer = ktc.is_kv_producer
        self.is_consumer = ktc.is_kv_consumer
        # The prefix cache's chain is the key chain when it hashes with sha256.
        self._shares_request_hashes = config.cache_config.prefix_caching_hash_algo == "sha256"
        self._last_warning: dict[str, float] = {}
        # Scheduler side.
        self._requests: dict[str, Request] = {}
        self._own_hashes: dict[str, list[bytes]] = {}
        self._lookup_start: dict[str, int] = {}  # first block the connector was asked about
        # After a failed lookup: until when lookups skip the store, and the last pause's length.
        self._lookups_off_until = 0.0
        self._lookup_pause = 0.0
        self._pending_loads: list[BlockTransfer] = []
        self._num_saved: dict[str, int] = {}  # leading blocks saved, loaded or already present
        self._saving: set[str] = set()  # requests whose async saves may still read blocks
        # Worker side.
        self._caches: list[torch.Tensor] = []
        # One stored block, all layers: [layers, 2, block_size, kv_heads, head_dim]; its
        # size; and how many blocks go through the host at once (~16 MiB). Set with the
        # caches (register_kv_caches).
        self._block_shape: tuple[int, ...] = ()
        self._block_bytes = 0
        self._chunk = 1
        self._pool: ThreadPoolExecutor | None = None
        self._loading: dict[str, tuple[BlockTransfer, Future[list[bytes | None]]]] = {}
        self._saves: defaultdict[str, list[Future[None]]] = defaultdict(list)
        self._finished: set[str] = set()
        self._load_errors: set[int] = set()
        self._stats = KVTransferStats()
        self._stats_lock = threading.Lock()
        self._local = threading.local()  # per-thread transfer buffers (_buffers)

    # --------------------------------------------------------------- the store

    @abc.abstractmethod
    def contains(self, keys: list[str]) -> list[bool]:
        """Whether each key is in the store (scheduler side).

        Raises:
            Exception: The store cannot be asked (then nothing is found).
        """

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """A block's bytes, ``None`` when absent."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> bool | None:
        """Store a block's bytes (replacing a block of the same key is harmless: same KV).

        Returns:
            False when the block was stored already and nothing was written (it is not
            counted in ``save_bytes``); anything else counts as written.
        """

    def clear(self) -> None:
        """Delete every block of this connector's namespace (:attr:`namespace`: the keys
        that start with ``f"{namespace}-"``, every rank's part) from the store, and
        nothing else (scheduler side, for :meth:`reset_cache`). Default: not supported
        (``reset_cache`` then returns ``None``, as a connector without the hook).

        Raises:
            NotImplementedError: The store cannot be emptied (the default).
            Exception: The store failed (``reset_cache`` logs it and returns False).
        """
        raise NotImplementedError

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Several blocks' bytes (``None`` where absent). Default: :meth:`get` per key; a
        store with round trips overrides it to batch them.

        Raises:
            Exception: The store cannot be read (every block of the call then counts as
                missing).
        """
        return [self.get(key) for key in keys]

    def put_many(self, items: list[tuple[str, bytes]]) -> int | None:
        """Store several blocks. Default: :meth:`put` per block.

        Returns:
            How many were written (``None``: all of them).
        """
        return sum(self.put(key, data) is not False for key, data in items)

    # ------------------------------------------------------------ helpers

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_warning.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._last_warning[kind] = now
            logger.warning(message, *args)

    def _keys(self, request: Request, num_blocks: int) -> list[str]:
        """The store keys of the request's first ``num_blocks`` full blocks."""
        if self._shares_request_hashes:
            hashes = request.block_hashes
        else:
            hashes = self._own_hashes.setdefault(request.request_id, [])
        extend_block_hashes(hashes, request.all_token_ids, num_blocks, self.block_size, request.cache_salt)
        return [f"{self.namespace}-{h.hex()}" for h in hashes[:num_blocks]]  # type: ignore[union-attr]

    # ------------------------------------------------------------ scheduler side

    def on_new_request(self, request: Request) -> None:
        self._requests[request.request_id] = request

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if not self.is_consumer:
            return 0, False
        start = num_computed_tokens // self.block_size
        limit = (request.num_tokens - 1) // self.block_size  # never the last token
        if limit <= start:
            return 0, False
        if time.monotonic() < self._lookups_off_until:
            return 0, False  # the store failed a moment ago: not asked (see the module)
        keys = self._keys(request, limit)[start:]
        try:
            if self.num_ranks == 1:
                found = self.contains(keys)
            else:  # every rank's part of each block
                parts = self.contains([f"{key}.r{rank}" for key in keys for rank in range(self.num_ranks)])
                found = [all(parts[i * self.num_ranks:(i + 1) * self.num_ranks]) for i in range(len(keys))]
        except Exception as exc:  # noqa: BLE001 - any store failure means "not found"
            first, most = _LOOKUP_BACKOFF_S
            self._lookup_pause = min(most, self._lookup_pause * 2) if self._lookup_pause else first
            self._lookups_off_until = time.monotonic() + self._lookup_pause
            self._warn("lookup", "%s lookup failed, computing prompts without it for %.0f s: %s",
                       self.store_name, self._lookup_pause, exc)
            return 0, False
        self._lookup_pause = 0.0
        hits = 0
        while hits < len(found) and found[hits]:
            hits += 1
        self._lookup_start[request.request_id] = start
        return hits * self.block_size, self.load_async and hits > 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_external_tokens: int) -> None:
        start = self._lookup_start.pop(request.request_id, 0)
        if not num_external_tokens:
            return
        end = start + num_external_tokens // self.block_size
        self._pending_loads.append(
            BlockTransfer(request.request_id, self._keys(request, end)[start:], list(block_ids[start:end])))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> BlockStoreMetadata:
        meta = BlockStoreMetadata(loads=self._pending_loads, preempted=list(scheduler_output.preempted_request_ids))
        self._pending_loads = []
        if not self.is_producer:
            return meta
        for item in scheduler_output.scheduled_requests:
            request = self._requests.get(item.request_id)
            if request is None:
                continue
            rid = item.request_id
            if item.is_new:
                # Everything before its first computed position was hit, loaded or is
                # being recomputed after a preemption (and was saved the first time).
                self._num_saved[rid] = item.start_position // self.block_size
            done = self._num_saved.get(rid, 0)
            full = min(item.start_position + len(item.token_ids), request.num_prompt_tokens) // self.block_size
            if full > done:
                meta.saves.append(BlockTransfer(rid, self._keys(request, full)[done:], request.block_ids[done:full]))
                self._num_saved[rid] = full
                if self.save_async:
                    self._saving.add(rid)
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        for state in (self._requests, self._own_hashes, self._lookup_start, self._num_saved):
            state.pop(rid, None)  # type: ignore[attr-defined]
        if rid in self._saving:
            self._saving.discard(rid)
            return True, None
        return False, None

    def reset_cache(self) -> bool | None:
        """Delete this namespace's blocks from the store (:meth:`clear`).

        Returns:
            True once they are gone; False (logged) when the store failed; ``None`` when
            the subclass has no :meth:`clear`.
        """
        if type(self).clear is BlockStoreConnector.clear:
            return super().reset_cache()
        try:
            self.clear()
        except Exception as exc:  # noqa: BLE001 - the caller learns it from the result
            logger.warning("%s: emptying the store for reset_prefix_cache(reset_connector=True) failed: %s",
                           self.store_name, exc)
            return False
        logger.info("%s: the blocks of namespace %s are deleted (reset_prefix_cache)", self.store_name,
                    self.namespace)
        return True

    # --------------------------------------------------------------- worker side

    def bind_connector_metadata(self, connector_metadata: BlockStoreMetadata) -> None:
        if self._key_suffix:  # this rank's parts of the blocks (each rank decoded its own copy)
            for transfer in (*connector_metadata.loads, *connector_metadata.saves):
                transfer.keys = [key + self._key_suffix for key in transfer.keys]
        super().bind_connector_metadata(connector_metadata)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._caches = list(kv_caches.values())
        cache = self._caches[0]
        self._block_shape = (len(self._caches), 2, *cache.shape[2:])
        self._block_bytes = math.prod(self._block_shape) * cache.element_size()
        self._chunk = max(1, (16 << 20) // self._block_bytes)
        if self.load_async or self.save_async:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"forkless-{self.store_name}")

    def handle_preemptions(self, kv_connector_metadata: BlockStoreMetadata) -> None:
        for rid in kv_connector_metadata.preempted:
            if rid in self._saves:
                for future in self._saves[rid]:
                    future.result()  # _put_blocks logs its own failures; this only waits
                # (The key stays: the scheduler still waits for the request's saves to be
                # reported when it finishes.)
                self._saves[rid] = []

    def wait_for_pending_saves(self) -> None:
        for futures in list(self._saves.values()):
            for future in futures:
                future.result()  # _put_blocks logs its own failures; this only waits
        # (The ids stay: get_finished still reports the finished requests' saves.)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta: BlockStoreMetadata = self._get_connector_metadata()
        for transfer in meta.loads:
            if self._pool is not None and self.load_async:
                self._loading[transfer.request_id] = (transfer, self._pool.submit(self._fetch, transfer))
            else:
                self._apply(transfer, self._fetch(transfer))

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing: every load is in the cache before the forward pass (or before the
        request runs at all, with ``load_async``)."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        """Nothing: a block is saved whole, all layers together, in :meth:`wait_for_save`."""

    def wait_for_save(self) -> None:
        meta: BlockStoreMetadata = self._get_connector_metadata()
        for transfer in meta.saves:
            # The blocks are copied out and encoded here, on the step's thread: that is
            # CPU work, which a background thread would only contend with the forward
            # pass's threads for; what may wait on a store -- the write -- goes to the
            # thread with save_async.
            started = time.perf_counter()
            items = self._encode_blocks(transfer)
            if items is None:
                continue
            if self._pool is not None and self.save_async:
                future = self._pool.submit(self._put_blocks, transfer, items, time.perf_counter() - started)
                self._saves[transfer.request_id].append(future)
            else:
                self._put_blocks(transfer, items, time.perf_counter() - started)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        received: set[str] = set()
        for rid, (transfer, future) in list(self._loading.items()):
            if future.done():
                del self._loading[rid]
                if rid not in finished_req_ids:  # an aborted request's blocks are not read again
                    self._apply(transfer, future.result())
                received.add(rid)
        sent: set[str] = set()
        self._finished |= finished_req_ids & self._saves.keys()
        for rid in list(self._finished):
            if all(future.done() for future in self._saves[rid]):
                del self._saves[rid]
                self._finished.discard(rid)
                sent.add(rid)
        return sent or None, received or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self) -> KVTransferStats | None:
        with self._stats_lock:
            stats, self._stats = self._stats, KVTransferStats()
        return stats if stats.load_bytes or stats.save_bytes else None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # -------------------------------------------------------- moving the bytes

    def _fetch(self, transfer: BlockTransfer) -> list[bytes | None]:
        """The stored bytes of a transfer's blocks (``None`` where absent or unreadable)."""
        started = time.perf_counter()
        out: list[bytes | None] = []
        step = self._chunk
        for first in range(0, len(transfer.keys), step):
            keys = transfer.keys[first : first + step]
            try:
                out.extend(self.get_many(keys))
            except Exception as exc:  # noqa: BLE001 - the blocks are recomputed instead
                self._warn("load", "%s: reading blocks of request %s failed: %s", self.store_name,
                           transfer.request_id, exc)
                out.extend([None] * len(keys))
        with self._stats_lock:
            self._stats.load_seconds += time.perf_counter() - started
        return out

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This thread's ``(device, host)`` buffers of ``_chunk`` blocks, each
        ``[n, layers, 2, block, heads, dim]``: allocated once and reused, since freshly
        mapped memory costs more in page faults than the copies themselves (the host one
        pinned on CUDA)."""
        import torch

        local = self._local
        if getattr(local, "buffers", None) is None:
            cache = self._caches[0]
            shape = (self._chunk, *self._block_shape)
            device = torch.empty(shape, dtype=cache.dtype, device=cache.device)
            host = device if cache.device.type == "cpu" else torch.empty(
                shape, dtype=cache.dtype, pin_memory=cache.device.type == "cuda")
            local.buffers = (device, host)
        return local.buffers

    def _apply(self, transfer: BlockTransfer, blobs: list[bytes | None]) -> None:
        """Write fetched blocks into the cache; report those that cannot be used."""
        import numpy as np
        import torch

        started = time.perf_counter()
        good: list[tuple[int, memoryview]] = []
        for key, block_id, blob in zip(transfer.keys, transfer.block_ids, blobs):
            try:
                if blob is None:
                    raise BlockLoadError("not in the store")
                good.append((block_id, self._check(key, blob)))
            except BlockLoadError as exc:
                self._warn("corrupt", "%s: block %s of request %s cannot be used (%s); its tokens are computed "
                           "instead", self.store_name, key, transfer.request_id, exc)
                self._load_errors.add(block_id)
        cache = self._caches[0]
        step = self._chunk
        for first in range(0, len(good), step):
            part = good[first : first + step]
            device_buf, host_buf = self._buffers()
            host = host_buf[: len(part)]
            rows = host.view(torch.uint8).view(len(part), -1).numpy()
            for row, (_, raw) in zip(rows, part):
                row[:] = np.frombuffer(raw, dtype=np.uint8)
            data = device_buf[: len(part)]  # [n, layers, 2, block, heads, dim]
            if device_buf is not host_buf:
                data.copy_(host)
            ids = torch.tensor([block_id for block_id, _ in part], dtype=torch.long, device=cache.device)
            for layer, layer_cache in enumerate(self._caches):
                layer_cache.index_copy_(1, ids, data[:, layer].transpose(0, 1))
        with self._stats_lock:
            self._stats.load_bytes += sum(len(raw) for _, raw in good)
            self._stats.load_seconds += time.perf_counter() - started

    def _encode_blocks(self, transfer: BlockTransfer) -> list[tuple[str, bytes]] | None:
        """A transfer's blocks copied out of the cache and encoded (``None``, logged, if
        that fails)."""
        import torch

        items: list[tuple[str, bytes]] = []
        step = self._chunk
        try:
            for first in range(0, len(transfer.block_ids), step):
                ids = torch.tensor(transfer.block_ids[first : first + step], dtype=torch.long,
                                   device=self._caches[0].device)
                device_buf, host_buf = self._buffers()
                data = device_buf[: len(ids)]  # [n, layers, 2, block, heads, dim]
                for layer, cache in enumerate(self._caches):
                    data[:, layer].copy_(cache.index_select(1, ids).transpose(0, 1))
                if host_buf is not device_buf:
                    host_buf[: len(ids)].copy_(data)
                    data = host_buf[: len(ids)]
                keys = transfer.keys[first : first + step]
                items.extend((key, self._encode(key, block)) for key, block in zip(keys, data))
        except Exception as exc:  # noqa: BLE001 - a dropped save is a later cache miss
            self._warn("save", "%s: saving blocks of request %s failed: %s", self.store_name,
                       transfer.request_id, exc)
            return None
        return items

    def _put_blocks(self, transfer: BlockTransfer, items: list[tuple[str, bytes]], encode_seconds: float) -> None:
        """Write encoded blocks to the store, a chunk per round trip (failures are logged)."""
        started = time.perf_counter()
        step = self._chunk
        written = 0  # (blocks a store had already are not saved bytes)
        try:
            for first in range(0, len(items), step):
                chunk = items[first : first + step]
                count = self.put_many(chunk)
                written += len(chunk) if count is None else count
        except Exception as exc:  # noqa: BLE001 - a dropped save is a later cache miss
            self._warn("save", "%s: saving blocks of request %s failed: %s", self.store_name,
                       transfer.request_id, exc)
            return
        with self._stats_lock:
            self._stats.save_bytes += written * self._block_bytes
            self._stats.save_seconds += encode_seconds + time.perf_counter() - started

    def _encode(self, key: str, block: torch.Tensor) -> bytes:
        from safetensors.torch import save

        crc = zlib.crc32(_raw_bytes(block))
        return save({"kv": block}, metadata={"key": key, "crc32": str(crc)})

    def _check(self, key: str, blob: bytes) -> memoryview:
        """The raw tensor bytes of a stored block, once its key, dtype, shape, size and
        checksum are what this cache expects (the safetensors header read by hand, so
        that the data is not copied before it goes into the cache).

        Raises:
            BlockLoadError: Why the block cannot be used.
        """
        view = memoryview(blob)
        try:
            header_len = int.from_bytes(view[:8], "little")
            header = json.loads(bytes(view[8 : 8 + header_len]))
            metadata = header.get("__metadata__", {})
            entry = header["kv"]
            begin, end = (8 + header_len + offset for offset in entry["data_offsets"])
        except Exception as exc:  # noqa: BLE001 - any parse failure is a corrupt block
            raise BlockLoadError(f"not a stored block: {exc}") from None
        if metadata.get("key") != key:
            raise BlockLoadError(f"it holds block {metadata.get('key')!r}")
        expected = list(self._block_shape)
        dtype = _dtype_names().get(self._caches[0].dtype)
        if entry.get("shape") != expected or entry.get("dtype") != dtype:
            raise BlockLoadError(f"shape {entry.get('shape')} {entry.get('dtype')}, expected {expected} {dtype}")
        raw = view[begin:end]
        if len(raw) != self._block_bytes or end > len(view):
            raise BlockLoadError(f"{len(raw)} bytes of data, truncated")
        if str(zlib.crc32(raw)) != metadata.get("crc32"):
            raise BlockLoadError("checksum mismatch")
        return raw


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    import torch

    return memoryview(tensor.contiguous().view(torch.uint8).numpy())


def store_namespace(config: Any) -> str:
    """A short name for what a block's KV depends on besides its tokens: the model as its
    clients name it (``--served-model-name``, by default the model argument as given, so
    that engines on several machines agree however their copies are laid out), its dtype,
    the cache dtype and the block size (shapes are checked again at load)."""
    mc, cc = config.model_config, config.cache_config
    parts = [mc.served_model_name, mc.dtype, cc.cache_dtype, cc.block_size]
    tp, pp = config.parallel_config.tensor_parallel_size, config.parallel_config.pipeline_parallel_size
    if tp > 1 or pp > 1:  # each rank's part of a block: 1/tp of its KV heads, of 1/pp of its layers
        parts.append(f"tp{tp}pp{pp}")
    ident = json.dumps(parts)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]
