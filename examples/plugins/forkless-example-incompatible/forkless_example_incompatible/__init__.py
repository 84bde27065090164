"""Declares `forkless>=99`: forkless skips it, naming both versions, and never calls this."""


def register() -> None:
    raise AssertionError("an incompatible plugin must never be called")
