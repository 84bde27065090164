"""The block store's worker side on real CPU cache tensors: what a save writes, a load puts
back block for block (all layers, keys and values); a block of another shape, another key,
with a flipped bit or missing is reported, not used; asynchronous saves are reported done
only for finished requests, and a preempted request's saves end before the next step. And
its scheduler side's lookups against a store that stops answering."""

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

    def put(self, key: str, data: bytes) -> bool:
        self.gate.wait(10)
        if key in self.data:
            return False
        self.data[key] = data
        return True


class AsyncMemoryStore(MemoryStore):
    load_async = True
    save_async = True


def _config(cls: type) -> SimpleNamespace:
    return SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector=cls.__name__),
        cache_config=SimpleNamespace(block_size=BLOCK, prefix_caching_hash_algo="sha256", cache_dtype="auto"),
        model_config=SimpleNamespace(served_model_name="m", dtype="float32"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, world_size=1))


def worker(cls: type, dtype: torch.dtype = torch.float32) -> tuple[BlockStoreConnector, list[torch.Tensor]]:
    conn = cls(_config(cls), KVConnectorRole.WORKER)
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
    block_bytes = LAYERS * 2 * BLOCK * HEADS * DIM * 4
    assert source.get_kv_connector_stats().save_bytes == 3 * block_bytes
    # Blocks the store had already are not counted as saved again.
    step(source, BlockStoreMetadata(saves=[BlockTransfer("a2", ["k1", "k2", "k9"], [5, 2, 1])]))
    assert source.get_kv_connector_stats().save_bytes == block_bytes

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
    assert stats.load_bytes == 2 * block_bytes


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


class FlakyStore(MemoryStore):
    """A store whose lookups time out while ``down`` is set, counting the times it is asked."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.down = True
        self.asked = 0

    def contains(self, keys: list[str]) -> list[bool]:
        self.asked += 1
        if self.down:
            raise TimeoutError("Timeout reading from socket")
        return super().contains(keys)


def test_a_store_that_stops_answering_is_not_asked_again_at_once(monkeypatch) -> None:
    # Each lookup runs on the scheduler's thread: one per admitted request, every one
    # waiting for the store's timeout, would stall every running request with it.
    from forkless.core.request import Request
    from forkless.kv_transfer import block_store
    from forkless.sampling_params import SamplingParams

    now = [100.0]
    monkeypatch.setattr(block_store, "time", SimpleNamespace(monotonic=lambda: now[0]))
    conn = FlakyStore(_config(FlakyStore), KVConnectorRole.SCHEDULER)
    requests = iter(Request(f"r{i}", list(range(1, 4 * BLOCK + 2)), SamplingParams(max_tokens=1)) for i in range(99))

    def lookup(at: float) -> tuple[int | None, bool]:
        now[0] = 100.0 + at
        return conn.get_num_new_matched_tokens(next(requests), 0)

    assert lookup(0) == (0, False) and conn.asked == 1  # failed: found nothing
    assert lookup(0.1) == lookup(0.9) == (0, False) and conn.asked == 1  # not asked for 1 s
    assert lookup(1.0) == (0, False) and conn.asked == 2  # asked again, failed again ...
    assert lookup(2.9) == (0, False) and conn.asked == 2  # ... so not for 2 s
    assert lookup(3.0) == (0, False) and conn.asked == 3
    assert lookup(6.9) == (0, False) and conn.asked == 3  # then 4 s
    # Back: the next lookup after the pause finds what the store holds, and the next
    # failure pauses 1 s again, not 8.
    conn.down = False
    first = Request("x", list(range(1, 4 * BLOCK + 2)), SamplingParams(max_tokens=1))
    conn.data.update({key: b"" for key in conn._keys(first, 2)})
    now[0] = 107.0
    assert conn.get_num_new_matched_tokens(first, 0) == (2 * BLOCK, False) and conn.asked == 4
    conn.down = True
    assert lookup(8.0) == (0, False) and conn.asked == 5
    assert lookup(9.0) == (0, False) and conn.asked == 6
