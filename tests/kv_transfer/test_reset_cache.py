"""``LLM.reset_prefix_cache(reset_connector=True)`` empties the KV connector's store, as
vLLM's ``KVConnectorBase_V1.reset_cache``: offline engines on the built-in connectors (a
shared folder; a real ``redis-server``) whose prompt loads from the store after a local
reset only, and is computed again after a connector reset, with the store emptied of this
engine's blocks and of nothing else; custom connectors without the hook (counted as reset,
logged) and with a hook that fails (the call returns False)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from forkless import LLM, SamplingParams
from forkless.kv_transfer import KVConnectorBase, KVConnectorMetadata
from tests.server.conftest import wait_until

pytestmark = pytest.mark.slow  # an engine start each

PROMPT = [(7 * i) % 3000 + 100 for i in range(100)]  # 6 full blocks of 16, and 4 tokens
BLOCKS = len(PROMPT) // 16
LOADED = (len(PROMPT) - 1) // 16 * 16  # every full block but never the last token's


def _engine(model: Path, connector: str, extra: dict[str, Any] | None = None, **more: Any) -> LLM:
    return LLM(str(model), max_model_len=256, kv_cache_memory=16 << 20, block_size=16,
               kv_transfer_config={"kv_connector": connector, "kv_role": "kv_both",
                                   "kv_connector_extra_config": extra or {}, **more})


def _generate(llm: LLM, max_tokens: int = 4) -> tuple[list[int], int]:
    """The prompt's greedy tokens and how many of its tokens were cached (here: loaded)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    (out,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    return list(out.outputs[0].token_ids), out.num_cached_tokens


def _external_hits(llm: LLM) -> int:
    return llm.llm_engine.engine_core.make_stats().kv_transfer.external_prefix_cache_hits


def test_shared_storage_reset_removes_the_engines_files(tiny_llama: Path, tmp_path: Path) -> None:
    store = tmp_path / "kv"
    foreign = store / "0123456789abcdef" / "ab" / "ab12.safetensors"  # another model's block
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"another namespace")
    llm = _engine(tiny_llama, "SharedStorageConnector", {"shared_storage_path": str(store)})
    try:
        reference, cached = _generate(llm)
        assert cached == 0
        own = lambda: [p for p in store.rglob("*") if p.is_file() and p != foreign]  # noqa: E731
        assert len(own()) == BLOCKS
        # Only the local prefix cache reset: the prompt loads from the folder.
        assert llm.reset_prefix_cache() is True
        assert _generate(llm) == (reference, LOADED)
        hits = _external_hits(llm)
        assert hits == LOADED

        assert llm.reset_prefix_cache(reset_connector=True) is True
        assert own() == []
        assert foreign.read_bytes() == b"another namespace"
        # Computed again, not loaded (nor hit locally), and saved again.
        assert _generate(llm) == (reference, 0)
        assert _external_hits(llm) == hits
        assert len(own()) == BLOCKS
    finally:
        llm.shutdown()


def test_redis_reset_deletes_only_its_own_keys(tiny_llama: Path, redis_url) -> None:
    import redis

    url, _ = redis_url
    client = redis.Redis.from_url(url)
    foreign = b"forkless:kv:0123456789abcdef-00"  # another model's block
    client.set(b"unrelated", b"keep")
    client.set(foreign, b"another namespace")
    own = lambda: [k for k in client.keys("forkless:kv:*") if k != foreign]  # noqa: E731
    llm = _engine(tiny_llama, "RedisConnector", {"url": url})
    try:
        # One token: generate() returns right after the prefill, whose blocks are written
        # on a thread; the reset lets those writes end before it deletes, so none lands
        # after it.
        reference, cached = _generate(llm, max_tokens=1)
        assert cached == 0
        assert llm.reset_prefix_cache(reset_connector=True) is True
        time.sleep(0.5)  # (a write the reset did not wait for would have landed by now)
        assert own() == []
        assert _generate(llm, max_tokens=1) == (reference, 0)
        assert wait_until(lambda: len(own()) == BLOCKS, 30), own()
        # Only the local prefix cache reset: the prompt loads from Redis.
        assert llm.reset_prefix_cache() is True
        assert _generate(llm, max_tokens=1) == (reference, LOADED)
        hits = _external_hits(llm)
        assert hits == LOADED

        assert llm.reset_prefix_cache(reset_connector=True) is True
        assert own() == []
        assert client.get(b"unrelated") == b"keep" and client.get(foreign) == b"another namespace"
        assert _generate(llm, max_tokens=1) == (reference, 0)
        assert _external_hits(llm) == hits
    finally:
        llm.shutdown()
        client.delete(b"unrelated", foreign)


class PlainConnector(KVConnectorBase):
    """A connector that moves nothing and has no ``reset_cache`` of its own."""

    requires_layer_hooks_in_decode = False

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()


class FailingResetConnector(PlainConnector):
    """A connector whose store cannot be emptied."""

    def reset_cache(self) -> bool:
        return False


def test_a_connector_without_reset_cache_counts_as_reset(tiny_llama: Path, caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    llm = _engine(tiny_llama, "PlainConnector", kv_connector_module_path=__name__)
    logging.getLogger("forkless").addHandler(caplog.handler)  # forkless does not propagate
    try:
        caplog.set_level(logging.DEBUG, logger="forkless.kv_transfer.interface")
        _generate(llm)
        assert llm.reset_prefix_cache(reset_connector=True) is True
        assert "PlainConnector does not implement reset_cache()" in caplog.text
        assert _generate(llm)[1] == 0  # the local prefix cache was reset too
    finally:
        logging.getLogger("forkless").removeHandler(caplog.handler)
        llm.shutdown()


def test_a_failed_connector_reset_fails_the_call(tiny_llama: Path) -> None:
    llm = _engine(tiny_llama, "FailingResetConnector", kv_connector_module_path=__name__)
    try:
        _generate(llm)
        assert llm.reset_prefix_cache(reset_connector=True) is False
        assert _generate(llm)[1] == 0  # the local prefix cache was reset all the same
        assert llm.reset_prefix_cache() is True  # the connector is not asked
    finally:
        llm.shutdown()


def test_shared_storage_saves_again_into_an_emptied_folder_with_the_umasks_mode(tiny_llama: Path,
                                                                                tmp_path: Path) -> None:
    """The README says to empty the store when weights change: saves went on failing
    (their folders were made only at start); and block files were 0600 whatever the umask,
    which engines of other users sharing the folder could not read."""
    import os
    import shutil
    import stat

    store = tmp_path / "kv"
    umask = os.umask(0o022)
    try:
        llm = _engine(tiny_llama, "SharedStorageConnector", {"shared_storage_path": str(store)})
        try:
            reference, _ = _generate(llm)
            files = lambda: [p for p in store.rglob("*.safetensors") if p.is_file()]  # noqa: E731
            assert len(files()) == BLOCKS
            assert {stat.S_IMODE(p.stat().st_mode) for p in files()} == {0o644}
            shutil.rmtree(store)
            store.mkdir()
            assert llm.reset_prefix_cache() is True
            assert _generate(llm) == (reference, 0)  # nothing to load: computed, and saved again
            assert len(files()) == BLOCKS
        finally:
            llm.shutdown()
    finally:
        os.umask(umask)
