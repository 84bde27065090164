"""``--kv-transfer-config``: every bad value is refused where it is given, with a message
naming the key, the value and what was expected; a good one reaches the engine config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from forkless.config import EngineArgs
from forkless.kv_transfer import KVConnectorFactory, KVTransferConfig


def engine_config(model: Path, **kw: object):
    return EngineArgs(model=str(model), **kw).create_engine_config()  # type: ignore[arg-type]


@pytest.mark.parametrize("value, message", [
    ("{not json", "--kv-transfer-config: not valid JSON"),
    ('["SharedStorageConnector"]', "expected a JSON object"),
    ('{"kv_role": "kv_both"}', "kv_connector=None is invalid"),
    ('{"kv_connector": "SharedStorageConnector", "kv_role": "producer"}',
     "kv_role='producer' is invalid: expected one of kv_producer, kv_consumer, kv_both"),
    ('{"kv_connector": "SharedStorageConnector", "kv_buffer_size": 1}', "unknown key(s) kv_buffer_size"),
    ('{"kv_connector": "SharedStorageConnector", "kv_connector_extra_config": 3}',
     "kv_connector_extra_config=3 is invalid"),
    ('{"kv_connector": "SharedStorageConnector", "kv_load_failure_policy": "retry"}',
     "kv_load_failure_policy='retry' is invalid: expected one of recompute, fail"),
])
def test_malformed_values_are_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        KVTransferConfig.from_json(value)
    assert message in str(info.value)


def test_roles() -> None:
    producer = KVTransferConfig.from_json({"kv_connector": "X", "kv_role": "kv_producer"})
    consumer = KVTransferConfig.from_json({"kv_connector": "X", "kv_role": "kv_consumer"})
    both = KVTransferConfig.from_json({"kv_connector": "X"})
    assert (producer.is_kv_producer, producer.is_kv_consumer) == (True, False)
    assert (consumer.is_kv_producer, consumer.is_kv_consumer) == (False, True)
    assert (both.is_kv_producer, both.is_kv_consumer) == (True, True)


def test_engine_config_checks_the_connector(tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        engine_config(tiny_llama, kv_transfer_config='{"kv_connector": "LMCacheConnectorV1"}')
    assert "'LMCacheConnectorV1'" in str(info.value)
    assert "RedisConnector" in str(info.value) and "SharedStorageConnector" in str(info.value)
    with pytest.raises(ValueError, match="kv_connector_module_path 'no_such_module' does not import"):
        engine_config(tiny_llama, kv_transfer_config={"kv_connector": "Mine", "kv_connector_module_path":
                                                     "no_such_module"})
    with pytest.raises(ValueError, match="does not work with --async-scheduling yet"):
        engine_config(tiny_llama, async_scheduling=True,
                      kv_transfer_config={"kv_connector": "SharedStorageConnector"})
    for extra, message in [
        ({}, "SharedStorageConnector needs kv_connector_extra_config.shared_storage_path"),
        ({"path": "/tmp"}, "unknown kv_connector_extra_config key(s) path; known: shared_storage_path"),
        # Refused here, before any engine process starts (each of them failed on it, with a traceback).
        ({"shared_storage_path": str(tiny_llama / "config.json" / "kv")},
         f"shared_storage_path '{tiny_llama / 'config.json' / 'kv'}' cannot be used as a folder: Not a directory"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            engine_config(tiny_llama, kv_transfer_config={"kv_connector": "SharedStorageConnector",
                                                          "kv_connector_extra_config": extra})
    for extra, message in [
        ({"url": "http://127.0.0.1:6379"}, "url='http://127.0.0.1:6379' is invalid"),
        ({"ttl_seconds": 0}, "ttl_seconds=0 is invalid: expected a positive integer"),
        ({"timeout_seconds": "2"}, "timeout_seconds='2' is invalid"),
        ({"host": "x"}, "unknown kv_connector_extra_config key"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            engine_config(tiny_llama, kv_transfer_config={"kv_connector": "RedisConnector",
                                                          "kv_connector_extra_config": extra})
    config = engine_config(tiny_llama, kv_transfer_config={
        "kv_connector": "SharedStorageConnector", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}})
    assert config.kv_transfer_config.kv_role == "kv_consumer"
    # It crosses to the engine core and workers as plain data.
    assert type(config).from_builtins(config.to_builtins()).kv_transfer_config == config.kv_transfer_config


def test_register_connector_by_module_path() -> None:
    KVConnectorFactory.register_connector("MySharedStorage", "forkless.kv_transfer.shared_storage",
                                          "SharedStorageConnector")
    assert "MySharedStorage" in KVConnectorFactory.get_supported_connectors()
    cls = KVConnectorFactory.get_connector_class(KVTransferConfig(kv_connector="MySharedStorage"))
    assert cls.__name__ == "SharedStorageConnector"


def test_vllm_0_32s_name_of_the_shared_storage_connector() -> None:
    from forkless.kv_transfer.shared_storage import SharedStorageConnector

    assert "ExampleConnector" in KVConnectorFactory.get_supported_connectors()
    assert KVConnectorFactory.get_connector_class(
        KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                         kv_connector_extra_config={"shared_storage_path": "/tmp/x"})) is SharedStorageConnector
