"""Registers ``SQLiteConnector`` with forkless's KV connector factory — by path.

This function runs in every forkless process; it is re-entrant (the same path twice is a
no-op) and cheap: the connector module is imported only when an engine is started with
``--kv-transfer-config '{"kv_connector": "SQLiteConnector", ...}'``.
"""


def register() -> None:
    from forkless.kv_transfer import KVConnectorFactory

    KVConnectorFactory.register_connector("SQLiteConnector", "forkless_example_kv_connector.connector",
                                          "SQLiteConnector")
