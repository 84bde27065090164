"""``RedisConnector``: KV blocks in a Redis server that engines on several machines share.

``kv_connector_extra_config.url`` names the server (``redis://host:6379/0``, the
default ``redis://127.0.0.1:6379``); ``ttl_seconds`` (optional) lets Redis expire blocks.
A block is one value, under ``forkless:kv:<key>`` (``forkless.kv_transfer.block_store``
says what the key is).

Invariants:
    * Network round trips never hold up the step loop: loads are fetched on a background
      thread while the request waits (``WAITING_FOR_REMOTE_KVS``) and copied into the cache
      between steps; a save's blocks are copied out and encoded after the step and written
      on the thread, and the request keeps its blocks until they are written. Blocks travel ~16 MiB per round
      trip (``MGET``, a pipeline of ``SET``), not one block per round trip.
    * The only Redis call on the scheduler's path is the admission lookup (one pipelined
      ``EXISTS`` per block); an unreachable server fails it within ``timeout_seconds``
      (default 2) and the request computes its prompt.
    * A reset (``reset_prefix_cache(reset_connector=True)``) deletes only this engine's
      keys, ``forkless:kv:<namespace>-*`` (``SCAN`` then ``UNLINK``), never anything else
      of the database (no ``FLUSHDB``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forkless.kv_transfer.block_store import BlockStoreConnector

if TYPE_CHECKING:
    from forkless.core.sched.config import KVCacheConfig
    from forkless.kv_transfer.interface import KVConnectorRole

_PREFIX = "forkless:kv:"
DEFAULT_URL = "redis://127.0.0.1:6379"


class RedisConnector(BlockStoreConnector):
    """KV blocks in Redis, loaded and saved asynchronously (provisional).

    Raises:
        ValueError: A malformed ``url``, ``ttl_seconds`` or ``timeout_seconds``, or the
            ``redis`` package is missing.
    """

    load_async = True
    save_async = True
    store_name = "redis"

    def __init__(self, config: Any, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(config, role, kv_cache_config)
        ktc = self._kv_transfer_config
        self.check_config(ktc)
        import redis

        url = ktc.get_from_extra_config("url", DEFAULT_URL)
        timeout = ktc.get_from_extra_config("timeout_seconds", 2.0)
        self._client: Any = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._ttl = ktc.get_from_extra_config("ttl_seconds", None)
        self.store_name = f"redis {url}"

    @classmethod
    def check_config(cls, kv_transfer_config: Any) -> None:
        ktc = kv_transfer_config
        unknown = sorted(set(ktc.kv_connector_extra_config) - {"url", "ttl_seconds", "timeout_seconds"})
        if unknown:
            raise ValueError(f"--kv-transfer-config: RedisConnector: unknown kv_connector_extra_config key(s) "
                             f"{', '.join(unknown)}; known: url, ttl_seconds, timeout_seconds")
        ttl = ktc.get_from_extra_config("ttl_seconds", None)
        timeout = ktc.get_from_extra_config("timeout_seconds", 2.0)
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0):
            raise ValueError(f"--kv-transfer-config: ttl_seconds={ttl!r} is invalid: expected a positive integer")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"--kv-transfer-config: timeout_seconds={timeout!r} is invalid: expected a positive "
                             "number")
        try:
            import redis
        except ImportError:
            raise ValueError("--kv-transfer-config: RedisConnector needs the redis package "
                             "(pip install redis)") from None
        url = ktc.get_from_extra_config("url", DEFAULT_URL)
        try:
            redis.connection.parse_url(url) if isinstance(url, str) else None
        except ValueError as exc:
            raise ValueError(f"--kv-transfer-config: url={url!r} is invalid: {exc}") from None
        if not isinstance(url, str):
            raise ValueError(f"--kv-transfer-config: url={url!r} is invalid: expected redis://host:port[/db]")

    def contains(self, keys: list[str]) -> list[bool]:
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(_PREFIX + key)
        return [bool(n) for n in pipe.execute()]

    def get(self, key: str) -> bytes | None:
        return self._client.get(_PREFIX + key)

    def put(self, key: str, data: bytes) -> None:
        self._client.set(_PREFIX + key, data, ex=self._ttl)

    def clear(self) -> None:
        batch: list[bytes] = []
        for key in self._client.scan_iter(match=f"{_PREFIX}{self.namespace}-*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self._client.unlink(*batch)
                batch = []
        if batch:
            self._client.unlink(*batch)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        # One round trip for a chunk of blocks (~16 MiB), not one per block.
        return self._client.mget([_PREFIX + key for key in keys])

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for key, data in items:
            pipe.set(_PREFIX + key, data, ex=self._ttl)
        pipe.execute()
