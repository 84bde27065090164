"""Worker extension classes (``worker_extension_cls``) for the ``LLM.collective_rpc``
tests: the ``mp`` executor's worker processes import them from ``tests``, as they do
the worker classes of ``mp_workers``."""

from __future__ import annotations

from typing import Any


class ModelInfoExtension:
    """Methods mixed into the worker class: they use the worker's own attributes."""

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.get_model().parameters())  # type: ignore[attr-defined]

    def rank_and(self, value: Any) -> dict[str, Any]:
        return {"rank": self.rank, "value": value}  # type: ignore[attr-defined]


class ClashingExtension:
    """Redefines a method the worker has (refused: an extension only adds names)."""

    def check_health(self) -> None:
        raise AssertionError("an extension must not replace the worker's methods")

    def extra(self) -> int:
        return 1
