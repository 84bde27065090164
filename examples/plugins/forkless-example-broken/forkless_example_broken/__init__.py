"""Plugins that fail on purpose: one raises when called, one names a missing module,
one platform detector raises. forkless must log each and carry on (or abort under
FORKLESS_PLUGINS_STRICT=1)."""


def register() -> None:
    raise RuntimeError("forkless-example-broken: this plugin fails on purpose")


def detect() -> str | None:
    raise RuntimeError("forkless-example-broken: this detector fails on purpose")
