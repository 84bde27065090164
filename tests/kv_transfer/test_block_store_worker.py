"""The block store's worker side on real CPU cache tensors: what a save writes, a load puts
back block for block (all layers, keys and values); a block of another shape, another key,
with a flipped bit or missing is reported, not used; asynchronous saves are reported done
only for finished requests, and a preempted request's saves end before the next step."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import torch

from forkless.kv_transfer.block_store import BlockStoreConnector, BlockStoreMetadata, BlockTransfer
from forkless.kv_transfer.config import KVTransferConfig
from forkless.kv_transfer.interface import ForwardContext, KVConnectorRole

LAYERS, BLOCKS, BLOCK, HEADS, DIM = 3, 8, 4, 2, 5


class MemoryStore(BlockStoreConnector):
    """Blocks in a dict; ``gate`` holds asynchronous puts until it is set."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.data: dict[str, bytes] = {}
        self.gate = threading.Event()
        self.gate.set()

    def contains(self, keys: list[str]) -> list[bool]:
        return [k in self.data for k in keys]

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.gate.wait(10)
        self.data[key] = data


class AsyncMemoryStore(MemoryStore):
    load_async = True
    save_async = True


def worker(cls: type, dtype: torch.dtype = torch.float32) -> tuple[BlockStoreConnector, list[torch.Tensor]]:
    config = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector=cls.__name__),
        cache_config=SimpleNamespace(block_size=BLOCK, prefix_caching_hash_algo="sha256", cache_dtype="auto"),
        model_config=SimpleNamespace(served_model_name="m", dtype="float32"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, world_size=1))
    conn = cls(config, KVConnectorRole.WORKER)
    caches = [torch.zeros(2, BLOCKS, BLOCK, HEADS, DIM, dtype=dtype) for _ in range(LAYERS)]
    conn.register_kv_caches({f"model.layers.{i}.self_attn.attn": c for i, c in enumerate(caches)})
    return conn, caches


def step(conn: BlockStoreConnector, meta: BlockStoreMetadata, finished: set[str] = frozenset()) -> tuple:
    conn.bind_connector_metadata(meta)
    conn.handle_preemptions(meta)
    conn.start_load_kv(ForwardContext({}))
    conn.wait_for_save()
    done = conn.get_finished(set(finished))
    errors = conn.get_block_ids_with_load_errors()
    conn.clear_connector_metadata()
    return done, errors


def test_a_saved_block_loads_back_exactly_and_bad_ones_are_reported() -> None:
    source, src_caches = worker(MemoryStore)
    for c in src_caches:
        c.copy_(torch.randn_like(c))
    step(source, BlockStoreMetadata(saves=[BlockTransfer("a", ["k1", "k2", "k3"], [5, 2, 7])]))
    assert set(source.data) == {"k1", "k2", "k3"}

    target, caches = worker(MemoryStore)
    target.data = dict(source.data)
    target.data["k2"] = bytearray(target.data["k2"])
    target.data["k2"][-1] ^= 1  # one flipped bit
    target.data["k4"] = source.data["k1"]  # stored under another key
    _, errors = step(target, BlockStoreMetadata(loads=[BlockTransfer("b", ["k1", "k2", "k3", "k4", "k5"],
                                                                    [0, 1, 3, 4, 6])]))
    assert errors == {1, 4, 6}  # corrupt, foreign, missing
    for layer, cache in enumerate(caches):
        assert torch.equal(cache[:, 0], src_caches[layer][:, 5])
        assert torch.equal(cache[:, 3], src_caches[layer][:, 7])
        assert not cache[:, 1].any() and not cache[:, 4].any() and not cache[:, 6].any()
    stats = target.get_kv_connector_stats()
    assert stats.load_bytes == 2 * LAYERS * 2 * BLOCK * HEADS * DIM * 4


def test_a_block_of_another_dtype_is_not_used() -> None:
    source, _ = worker(MemoryStore, torch.bfloat16)
    step(source, BlockStoreMetadata(saves=[BlockTransfer("a", ["k"], [1])]))
    target, _ = worker(MemoryStore)
    target.data = source.data
    assert step(target, BlockStoreMetadata(loads=[BlockTransfer("b", ["k"], [2])]))[1] == {2}


def test_async_saves_are_reported_when_done_and_finished() -> None:
    conn, caches = worker(AsyncMemoryStore)
    conn.gate.clear()  # the store is slow
    (sent, _), _ = step(conn, BlockStoreMetadata(saves=[BlockTransfer("a", ["k1"], [1]),
                                                        BlockTransfer("b", ["k2"], [2])]))
    assert sent is None
    (sent, _), _ = step(conn, BlockStoreMetadata(), finished={"a"})
    assert sent is None  # "a" finished, but its save is still writing
    conn.gate.set()
    sent = None
    for _ in range(100):
        (sent, _), _ = step(conn, BlockStoreMetadata())
        if sent:
            break
        threading.Event().wait(0.01)
    assert sent == {"a"}  # done and finished; "b" is done but still running
    # A preempted request's saves end before the step goes on (its blocks get reused).
    conn.gate.clear()
    step(conn, BlockStoreMetadata(saves=[BlockTransfer("c", ["k3"], [3])]))
    threading.Timer(0.2, conn.gate.set).start()
    step(conn, BlockStoreMetadata(preempted=["c"]))
    assert "k3" in conn.data
    (sent, _), _ = step(conn, BlockStoreMetadata(), finished={"c"})
    assert sent == {"c"}  # still reported once it finishes (the scheduler waits for it)
    (sent, _), _ = step(conn, BlockStoreMetadata(), finished={"b", "x"})  # "x" never saved
    assert sent == {"b"}
    conn.shutdown()


def test_async_loads_end_between_steps() -> None:
    source, src_caches = worker(MemoryStore)
    for c in src_caches:
        c.copy_(torch.randn_like(c))
    step(source, BlockStoreMetadata(saves=[BlockTransfer("a", ["k1"], [4])]))
    target, caches = worker(AsyncMemoryStore)
    target.data = source.data
    meta = BlockStoreMetadata(loads=[BlockTransfer("b", ["k1"], [0])])
    received = None
    for _ in range(100):
        (_, received), _ = step(target, meta)
        meta = BlockStoreMetadata()
        if received:
            break
        threading.Event().wait(0.01)
    assert received == {"b"}
    assert torch.equal(caches[1][:, 0], src_caches[1][:, 4])
    target.shutdown()
