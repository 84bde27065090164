"""``SharedStorageConnector``: KV blocks as files in a folder that engines share.

``kv_connector_extra_config.shared_storage_path`` names the folder (local, or a network
file system that several machines mount). Each block is one file,
``<path>/<namespace>/<key[:2]>/<key>.safetensors`` (``forkless.kv_transfer.block_store``
says what the key and namespace are), so any engine of the same model pointing at the
folder reuses the prefill of another.

Invariants:
    * Loads and saves are synchronous: a request's blocks are read into the cache before
      the forward pass of the step that admits it, and the step's new prompt blocks are
      written right after it (so nothing is deferred and no block is kept past its
      request).
    * A file appears whole or not at all (written to a temporary name, then renamed), so
      a reader never sees half a block; a block already on disk is not written again. Its
      mode follows the umask, as any file's; its folders are made again if removed.
    * A reset (``reset_prefix_cache(reset_connector=True)``) removes every block file of
      this engine's namespace folder and its emptied sub-folders; other namespaces'
      folders, and the temporary files of writes in progress, are left alone.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkless.kv_transfer.block_store import BlockStoreConnector

# The process's umask, read once (setting it is the only way to read it).
_UMASK = os.umask(0)
os.umask(_UMASK)

if TYPE_CHECKING:
    from forkless.core.sched.config import KVCacheConfig
    from forkless.kv_transfer.interface import KVConnectorRole


class SharedStorageConnector(BlockStoreConnector):
    """KV blocks in a shared folder, one file per block (provisional).

    Raises:
        ValueError: ``shared_storage_path`` is missing or cannot be created.
    """

    store_name = "shared storage"

    def __init__(self, config: Any, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(config, role, kv_cache_config)
        self.check_config(self._kv_transfer_config)
        self.root = Path(self._kv_transfer_config.kv_connector_extra_config["shared_storage_path"]) / self.namespace
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--kv-transfer-config: shared_storage_path cannot be used: {exc}") from None

    @classmethod
    def check_config(cls, kv_transfer_config: Any) -> None:
        unknown = sorted(set(kv_transfer_config.kv_connector_extra_config) - {"shared_storage_path"})
        if unknown:
            raise ValueError(f"--kv-transfer-config: SharedStorageConnector: unknown kv_connector_extra_config "
                             f"key(s) {', '.join(unknown)}; known: shared_storage_path")
        path = kv_transfer_config.get_from_extra_config("shared_storage_path", None)
        if not isinstance(path, str) or not path:
            raise ValueError("--kv-transfer-config: SharedStorageConnector needs kv_connector_extra_config."
                             f"shared_storage_path (a folder), got {path!r}")
        # Here, before any engine process starts, rather than in each of them (the
        # constructor makes the model's sub-folder).
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--kv-transfer-config: shared_storage_path {path!r} cannot be used as a folder: "
                             f"{exc.strerror or exc}") from None
        needed = os.R_OK | os.X_OK | (os.W_OK if kv_transfer_config.is_kv_producer else 0)
        if not os.access(path, needed):
            raise ValueError(f"--kv-transfer-config: shared_storage_path {path!r} is not "
                             f"{'readable and writable' if needed & os.W_OK else 'readable'} by this process "
                             f"({kv_transfer_config.kv_role} {'saves' if needed & os.W_OK else 'loads'} blocks there)")

    def _path(self, key: str) -> Path:
        digest = key.rsplit("-", 1)[-1]
        return self.root / digest[:2] / f"{digest}.safetensors"

    def contains(self, keys: list[str]) -> list[bool]:
        found = []
        for key in keys:
            found.append(self._path(key).is_file())
            if not found[-1]:
                break  # a lookup stops at the first miss anyway
        return found

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def clear(self) -> None:
        if not self.root.is_dir():
            return
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for path in sub.glob("*.safetensors"):
                path.unlink(missing_ok=True)
            try:
                sub.rmdir()
            except OSError:
                pass  # a write in progress (its temporary file) keeps it: the block is not the store's yet

    def put(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if path.is_file():
            return False
        # Every time (vLLM's too): an operator may empty the store while engines run.
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            # mkstemp makes the file 0600; a block must be as readable as any file this
            # engine writes (the umask's mode), or engines of other users sharing the folder
            # could never load it.
            os.fchmod(fd, 0o666 & ~_UMASK)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return True
