"""``SQLiteConnector``: KV-cache blocks in one SQLite file that engines on one machine share.

``--kv-transfer-config '{"kv_connector": "SQLiteConnector", "kv_role": "kv_both",
"kv_connector_extra_config": {"sqlite_path": "/tmp/kv.sqlite"}}'``: every engine of the
same model pointing at the file reuses the prompts the others computed.

All the KV-cache work (which blocks a request can load, copying blocks in and out of the
cache, checking what is read back) is done by ``forkless.kv_transfer.BlockStoreConnector``.
A store only answers three questions about whole blocks, keyed by strings that already
name the model and the block's whole prefix: ``contains``, ``get`` and ``put``; ``clear``
(optional) empties it for ``LLM.reset_prefix_cache(reset_connector=True)``.

Invariants:
    * One table, ``kv_blocks(key TEXT PRIMARY KEY, data BLOB)``. A key's bytes never
      change (the same key is the same KV), so a second ``put`` of a key is ignored.
    * Each instance has one connection, guarded by a lock: the connector is built twice
      per engine (scheduler side in the engine core, worker side in each worker), and
      with ``load_async`` / ``save_async`` a worker calls the store from a thread pool.
    * WAL mode: readers in other processes are not blocked while a worker writes.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from forkless.kv_transfer import BlockStoreConnector, KVConnectorRole

# SQLite allows at most 999 "?" in one statement in older builds: ask in chunks.
_MAX_PARAMS = 500


class SQLiteConnector(BlockStoreConnector):
    """KV blocks in one SQLite file (provisional interface).

    Raises:
        ValueError: ``kv_connector_extra_config.sqlite_path`` is missing, another key is
            given, or the file cannot be opened as a database.
    """

    # Synchronous loads and saves (BlockStoreConnector's default): a local file is fast,
    # so a request's blocks are read before the step that admits it runs, and the step's
    # new prompt blocks are written right after it. A store over the network would set
    # ``load_async = save_async = True`` instead (see forkless's RedisConnector).
    load_async = False
    save_async = False
    store_name = "sqlite"

    @classmethod
    def check_config(cls, kv_transfer_config: Any) -> None:
        # Runs where --kv-transfer-config is given, before any engine process starts: a
        # bad setting is refused there, with a message naming it.
        extra = kv_transfer_config.kv_connector_extra_config
        unknown = sorted(set(extra) - {"sqlite_path"})
        if unknown:
            raise ValueError(f"--kv-transfer-config: SQLiteConnector: unknown kv_connector_extra_config key(s) "
                             f"{', '.join(unknown)}; known: sqlite_path")
        path = extra.get("sqlite_path")
        if not isinstance(path, str) or not path:
            raise ValueError("--kv-transfer-config: SQLiteConnector needs kv_connector_extra_config.sqlite_path "
                             f"(a database file, created if absent), got {path!r}")

    def __init__(self, config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(config, role, kv_cache_config)
        self.check_config(self._kv_transfer_config)  # also when built without EngineArgs
        path = self._kv_transfer_config.kv_connector_extra_config["sqlite_path"]
        self.store_name = f"sqlite {path}"
        self._lock = threading.Lock()
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit, each put is its own transaction.
            # check_same_thread=False: the lock, not the thread, guards the connection.
            self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # A lost write after a power cut is only a later cache miss: no fsync per block.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS kv_blocks (key TEXT PRIMARY KEY, data BLOB NOT NULL)")
        except (OSError, sqlite3.Error) as exc:
            raise ValueError(f"--kv-transfer-config: sqlite_path {path!r} cannot be used: {exc}") from None

    # The store. An exception from any of these is caught by BlockStoreConnector, logged,
    # and treated as a miss (contains), a failed load (get: the tokens are recomputed) or
    # a dropped save (put): a broken store never fails a request.

    def contains(self, keys: list[str]) -> list[bool]:
        found: set[str] = set()
        with self._lock:
            for i in range(0, len(keys), _MAX_PARAMS):
                chunk = keys[i : i + _MAX_PARAMS]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(f"SELECT key FROM kv_blocks WHERE key IN ({marks})", chunk)
                found.update(key for (key,) in rows)
        return [key in found for key in keys]

    def get(self, key: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM kv_blocks WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, key: str, data: bytes) -> bool:
        with self._lock:
            cursor = self._db.execute("INSERT OR IGNORE INTO kv_blocks (key, data) VALUES (?, ?)", (key, data))
        return cursor.rowcount > 0  # (False: stored already, nothing written)

    def clear(self) -> None:
        # reset_prefix_cache(reset_connector=True): this engine's blocks only (the keys of
        # its namespace: this model, dtypes, block size), not other models' in the file.
        prefix = f"{self.namespace}-"
        with self._lock:
            self._db.execute("DELETE FROM kv_blocks WHERE substr(key, 1, ?) = ?", (len(prefix), prefix))

    def shutdown(self) -> None:
        super().shutdown()  # waits for the thread pool, if any, before the connection goes
        with self._lock:
            self._db.close()
