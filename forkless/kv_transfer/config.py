"""``--kv-transfer-config``: vLLM's keys, checked where they are given.

Invariants:
    * Every key forkless reads is a field here; an unknown key is an error naming it and
      the known ones (nothing is accepted and ignored).
    * ``kv_connector`` is a registered name or, with ``kv_connector_module_path``, a class
      of that module; whether it resolves is checked when the engine is built, after
      the general plugins have had their chance to register it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forkless.json_arg import json_config_arg

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")

_FLAG = "--kv-transfer-config"


@dataclass(frozen=True)
class KVTransferConfig:
    """Which KV connector the engine runs, and in which role.

    Attributes:
        kv_connector: A name registered with ``KVConnectorFactory`` (built-ins:
            ``SharedStorageConnector``, ``RedisConnector``), or a class name in
            ``kv_connector_module_path``.
        kv_role: ``kv_producer`` (saves the KV it computes), ``kv_consumer`` (loads KV
            others saved) or ``kv_both``.
        kv_connector_module_path: A module to take ``kv_connector`` from, for a connector
            that was not registered.
        kv_connector_extra_config: The connector's own settings (for the built-ins:
            ``shared_storage_path``, ``url``).
        engine_id: A name for this engine in the connector's logs (vLLM's key); ``None``:
            none.
        kv_load_failure_policy: What a request whose KV blocks failed to load gets
            (vLLM's key): ``recompute`` (forkless's default) computes them instead, from
            the first failed block; ``fail`` (vLLM's default) ends the request with an
            error (HTTP 500, as vLLM's).
    """

    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_module_path: str | None = None
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    engine_id: str | None = None
    kv_load_failure_policy: str = "recompute"

    @property
    def is_kv_producer(self) -> bool:
        """Whether this engine saves the KV it computes."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        """Whether this engine loads KV from the connector."""
        return self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        """``kv_connector_extra_config[key]``, or ``default`` (vLLM's helper)."""
        return self.kv_connector_extra_config.get(key, default)

    @classmethod
    def from_json(cls, value: str | dict[str, Any] | KVTransferConfig | None) -> KVTransferConfig | None:
        """Parse the flag's JSON (or a dict, as ``LLM(kv_transfer_config=...)`` takes).

        Raises:
            ValueError: Not a JSON object, an unknown key, a missing ``kv_connector``, or
                a value of the wrong type.
        """
        if value is None or isinstance(value, cls):
            return value
        value = json_config_arg(value, _FLAG, cls)
        connector = value.get("kv_connector")
        if not isinstance(connector, str) or not connector:
            raise ValueError(f"{_FLAG}: kv_connector={connector!r} is invalid: expected the name of a registered "
                             "connector (SharedStorageConnector, RedisConnector, ...) or a class name in "
                             "kv_connector_module_path")
        role = value.get("kv_role", "kv_both")
        if role not in KV_ROLES:
            raise ValueError(f"{_FLAG}: kv_role={role!r} is invalid: expected one of {', '.join(KV_ROLES)}")
        for key in ("kv_connector_module_path", "engine_id"):
            if value.get(key) is not None and not isinstance(value[key], str):
                raise ValueError(f"{_FLAG}: {key}={value[key]!r} is invalid: expected a string")
        policy = value.get("kv_load_failure_policy", "recompute")
        if policy not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(f"{_FLAG}: kv_load_failure_policy={policy!r} is invalid: expected one of "
                             f"{', '.join(KV_LOAD_FAILURE_POLICIES)}")
        extra = value.get("kv_connector_extra_config", {})
        if not isinstance(extra, dict):
            raise ValueError(f"{_FLAG}: kv_connector_extra_config={extra!r} is invalid: expected a JSON object")
        return cls(**value)
