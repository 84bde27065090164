"""The scheduler's side of KV connectors, step by step with the fake runner: the built-in
block-store connector's scheduler side over an in-memory store, whose worker side the
test plays (loads write the fake KV slots, saves read them), synchronously and with
transfers that end steps later. Every step re-checks that attention reads exactly the
tokens of every earlier position, so a block freed while a save still reads it, or used
before its load ended, or a failed load that is not recomputed, fails here."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from core_fakes import Result, assert_no_leaks, check_step, default_token, make_request, make_scheduler
from forkless.core.request import RequestStatus
from forkless.kv_transfer.block_store import BlockStoreConnector
from forkless.kv_transfer.config import KVTransferConfig
from forkless.kv_transfer.interface import KVConnectorRole
from forkless.protocol.kv_transfer import KVConnectorOutput, decode_connector_metadata
from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput

BLOCK = 4


class DictStore(BlockStoreConnector):
    """The block store as a dict (its scheduler side is what this test exercises)."""

    store: dict[str, Any] = {}

    def contains(self, keys: list[str]) -> list[bool]:
        return [k in self.store for k in keys]

    def get(self, key: str) -> Any:
        return self.store.get(key)

    def put(self, key: str, data: Any) -> None:
        self.store[key] = data


class AsyncDictStore(DictStore):
    load_async = True
    save_async = True


def connector(cls: type, role: str = "kv_both") -> BlockStoreConnector:
    config = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector=cls.__name__, kv_role=role),
        cache_config=SimpleNamespace(block_size=BLOCK, prefix_caching_hash_algo="sha256", cache_dtype="auto"),
        model_config=SimpleNamespace(served_model_name="fake", dtype="float32"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, world_size=1),
    )
    return cls(config, KVConnectorRole.SCHEDULER)


class Engine:
    """A scheduler with a connector, and the connector's worker side played on the fake
    runner's KV slots; ``delay`` steps pass before an asynchronous transfer ends."""

    def __init__(self, cls: type, store: dict[str, Any], role: str = "kv_both", delay: int = 0, **kw: Any) -> None:
        self.scheduler, self.runner = make_scheduler(num_blocks=64, block_size=BLOCK, max_model_len=128, **kw)
        cls.store = store
        self.conn = connector(cls, role)
        self.scheduler.set_kv_connector(self.conn)
        self.store = store
        self.delay = delay
        self.loads: list[tuple[int, Any]] = []  # (steps left, transfer)
        self.saves: list[tuple[int, Any]] = []
        self.saving_finished: set[str] = set()
        self.corrupt: set[str] = set()
        self.results: dict[str, Result] = {}

    def _load(self, transfer: Any) -> list[int]:
        bad = []
        for key, block in zip(transfer.keys, transfer.block_ids):
            data = self.store.get(key)
            if data is None or key in self.corrupt:
                bad.append(block)
                continue
            for offset, slot in enumerate(data):
                self.runner.slots[block * BLOCK + offset] = slot
        return bad

    def _save(self, transfer: Any) -> None:
        for key, block in zip(transfer.keys, transfer.block_ids):
            data = [self.runner.slots[block * BLOCK + o] for o in range(BLOCK)]
            assert None not in data, f"saving block {block} of {transfer.request_id}, never written"
            self.store[key] = data

    def step(self) -> Any:
        s, runner = self.scheduler, self.runner
        out = s.schedule()
        check_step(s, out)
        meta = decode_connector_metadata(out.kv_connector_metadata, type(self.conn).metadata_cls)
        for rid in meta.preempted:  # handle_preemptions: saves reading its blocks end now
            for entry in [e for e in self.saves if e[1].request_id == rid]:
                self._save(entry[1])
                self.saves.remove(entry)
        bad: list[int] = []
        received: list[str] = []
        async_loads = type(self.conn).load_async
        for transfer in meta.loads:
            if async_loads:
                self.loads.append((self.delay, transfer))
            else:
                bad += self._load(transfer)
        # The fake runner checks that every position it attends over holds its token;
        # tokens loaded by this step are in the slots already (sync), or the request is
        # not in the step at all (async).
        runner_out = runner.execute(out) if not bad else self._execute_dropping(out, bad)
        for transfer in meta.saves:
            if type(self.conn).save_async:
                self.saves.append((self.delay, transfer))
            else:
                self._save(transfer)
        # Transfers in flight age; those due end (a load writes its blocks now).
        for transfer in _age(self.loads):
            if transfer.request_id not in out.finished_request_ids:
                bad += self._load(transfer)
            received.append(transfer.request_id)
        for transfer in _age(self.saves):
            self._save(transfer)
        self.saving_finished |= set(out.finished_request_ids)
        pending = {e[1].request_id for e in self.saves}
        sent = sorted(r for r in self.saving_finished if r not in pending)
        self.saving_finished -= set(sent)
        runner_out.kv_connector_output = KVConnectorOutput(finished_sending=sent, finished_recving=received,
                                                           invalid_block_ids=sorted(bad))
        for eco in s.update_from_output(out, runner_out):
            result = self.results.setdefault(eco.request_id, Result())
            result.token_ids.extend(eco.new_token_ids)
            result.num_cached_tokens = eco.num_cached_tokens
            if eco.finished:
                result.finish_reason = eco.finish_reason
        s.kv_cache_manager.check_invariants()
        return out

    def _execute_dropping(self, out: Any, bad: list[int]) -> ModelRunnerOutput:
        """A step in which some loads failed: the rest of the batch runs; a request holding a
        failed block is registered but nothing it computed counts (its KV past the block is
        wrong, so is its token), as the model runner drops it."""
        runner = self.runner
        hit = [item for item in out.scheduled_requests
               if set(self.scheduler.requests[item.request_id].block_ids) & set(bad)]
        rest = dataclasses.replace(out, scheduled_requests=[i for i in out.scheduled_requests if i not in hit])
        result = runner.execute(rest)
        for item in hit:
            rid = item.request_id
            runner.block_tables.apply(SchedulerOutput(scheduled_requests=[item]))
            if item.is_new:
                runner.tokens[rid] = list(item.prompt_token_ids) + list(item.output_token_ids)
                runner.num_prompt[rid] = len(item.prompt_token_ids)
            table = runner.block_tables.tables[rid]
            runner.computed[rid] = min(i for i, b in enumerate(table) if b in bad) * BLOCK
        return result

    def run(self, max_steps: int = 500) -> dict[str, Result]:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                return self.results
            self.step()
        raise AssertionError("the engine did not finish")


def _age(in_flight: list[tuple[int, Any]]) -> list[Any]:
    """One step passes for the transfers in flight: those due leave the list, in order."""
    due = [transfer for left, transfer in in_flight if left == 0]
    in_flight[:] = [(left - 1, transfer) for left, transfer in in_flight if left > 0]
    return due


PROMPT = [default_token("p", i) % 50 + 3 for i in range(23)]  # 5 full blocks + 3 tokens


@pytest.mark.parametrize("cls", [DictStore, AsyncDictStore])
def test_a_second_engine_loads_what_the_first_saved(cls: type) -> None:
    store: dict[str, Any] = {}
    first = Engine(cls, store, delay=2)
    first.scheduler.add_request(make_request("p", PROMPT, max_tokens=5))
    first.run()
    assert len(store) == len(PROMPT) // BLOCK  # the prompt's full blocks
    assert_no_leaks(first.scheduler)  # an async save's blocks were kept, then freed

    second = Engine(cls, store, delay=2)
    second.scheduler.add_request(make_request("p", PROMPT, max_tokens=5))
    out = second.step()
    if cls.load_async:
        # Admitted with its blocks, waiting for them: not in the step.
        assert not out.scheduled_requests
        assert second.scheduler.requests["p"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    else:
        # Loaded before this step's forward pass; only the last 3 tokens are computed.
        assert [(i.start_position, i.num_tokens) for i in out.scheduled_requests] == [(20, 3)]
    second.run()
    assert second.results["p"].token_ids == first.results["p"].token_ids
    assert second.results["p"].num_cached_tokens == 20
    stats = second.scheduler.make_stats().kv_transfer
    assert (stats.external_prefix_cache_queries, stats.external_prefix_cache_hits) == (23, 20)
    assert_no_leaks(second.scheduler)


def test_an_aborted_request_keeps_its_blocks_until_its_load_ends() -> None:
    store: dict[str, Any] = {}
    first = Engine(AsyncDictStore, store)
    first.scheduler.add_request(make_request("p", PROMPT, max_tokens=2))
    first.run()
    second = Engine(AsyncDictStore, store, delay=3)
    second.scheduler.add_request(make_request("p", PROMPT, max_tokens=2))
    second.step()
    held = list(second.scheduler.kv_cache_manager.get_block_ids("p"))
    assert held
    second.scheduler.finish_requests("p")
    second.step()
    # The load still writes them: not free yet.
    assert second.scheduler.kv_cache_manager.num_free_blocks < 64
    second.run()
    assert_no_leaks(second.scheduler)


@pytest.mark.parametrize("cls", [DictStore, AsyncDictStore])
def test_a_failed_block_is_computed_from_there(cls: type) -> None:
    store: dict[str, Any] = {}
    first = Engine(cls, store)
    first.scheduler.add_request(make_request("p", PROMPT, max_tokens=4))
    first.run()
    second = Engine(cls, store, delay=1)
    second.corrupt = {first.conn._keys(make_request("p", PROMPT), 5)[2]}  # the third block fails to load
    second.scheduler.add_request(make_request("p", PROMPT, max_tokens=4))
    second.run()
    assert second.results["p"].token_ids == first.results["p"].token_ids
    assert second.results["p"].num_cached_tokens == 2 * BLOCK  # what actually loaded
    assert_no_leaks(second.scheduler)


def test_a_producer_saves_each_prompt_block_once_and_a_consumer_none() -> None:
    store: dict[str, Any] = {}
    producer = Engine(DictStore, store, role="kv_producer", max_num_batched_tokens=6)
    producer.scheduler.add_request(make_request("p", PROMPT, max_tokens=3))
    producer.run()  # the prompt in chunks of 6: blocks saved as they fill
    assert len(store) == 5
    assert producer.scheduler.make_stats().kv_transfer.external_prefix_cache_hits == 0  # never loads
    consumer = Engine(DictStore, {}, role="kv_consumer")
    consumer.scheduler.add_request(make_request("q", PROMPT, max_tokens=3))
    consumer.run()
    assert consumer.store == {}
