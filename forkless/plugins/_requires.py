"""Whether a plugin's ``Requires-Dist: forkless...`` line admits the running forkless.

Invariants:
    * The plain forms plugins write (``forkless>=0.1``, ``forkless<1,>=0.1``,
      ``forkless (~=0.1)``: no marker, no extra, release versions only, running a release
      version) are decided here, without ``packaging``: importing it cost ~12 ms of every
      process's first plugin load (``benchmarks/plugin_discovery.py``), more than the
      whole entry-point scan of 100 distributions.
    * Anything else (markers, wildcards, pre-/post-/dev-releases, ``===``) returns
      :data:`UNDECIDED`, and the caller asks ``packaging``: the answers are PEP 440's.
    * The specifier text in a verdict is written as ``packaging.SpecifierSet`` writes it
      (clauses sorted, no spaces), so messages do not depend on which path decided.
"""

from __future__ import annotations

import re

#: Returned when the line is not of a plain form (ask ``packaging``).
UNDECIDED = object()

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*")
_CLAUSE = re.compile(r"\s*(~=|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+)*)\s*")
_RELEASE = re.compile(r"\d+(?:\.\d+)*")


def _release(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # PEP 440: 1.0 == 1.0.0
        parts.pop()
    return tuple(parts)


def _admits(op: str, version: str, running: tuple[int, ...]) -> bool:
    wanted = _release(version)
    if op == "==":
        return running == wanted
    if op == "!=":
        return running != wanted
    if op == ">=":
        return running >= wanted
    if op == "<=":
        return running <= wanted
    if op == ">":
        return running > wanted
    if op == "<":
        return running < wanted
    # ~=X.Y.Z: >= X.Y.Z and == X.Y.* (the prefix of every component but the last).
    prefix = [int(p) for p in version.split(".")][:-1]
    padded = list(running) + [0] * max(0, len(prefix) - len(running))
    return running >= wanted and padded[: len(prefix)] == prefix


def check_plain(line: str, running: str) -> str | None | object:
    """Decide a ``Requires-Dist`` line of a plain form against forkless ``running``.

    Args:
        line: The line's value, e.g. ``"forkless<1,>=0.1"``.
        running: The running forkless version, e.g. ``"0.1.0"``.

    Returns:
        ``None`` when the line admits ``running`` (or names another distribution), the
        specifier text (``"<1,>=0.1"``) when it does not, or :data:`UNDECIDED` when the
        line is not of a plain form.
    """
    if ";" in line or "[" in line or "@" in line or not _RELEASE.fullmatch(running):
        return UNDECIDED
    m = _NAME.match(line)
    if m is None:
        return UNDECIDED
    if m.group(1).lower().replace("_", "-").replace(".", "-") != "forkless":
        return None
    rest = line[m.end():].strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    clauses: list[tuple[str, str]] = []
    if rest.strip():
        for part in rest.split(","):
            c = _CLAUSE.fullmatch(part)
            if c is None or (c.group(1) == "~=" and "." not in c.group(2)):
                return UNDECIDED
            clauses.append((c.group(1), c.group(2)))
    # packaging's SpecifierSet is a set: an exact repeat is written once. Two spellings of
    # one clause (">=1,>=1.0") keep an arbitrary one of them: leave those to packaging.
    canonical = {(op, _release(v)) if op != "~=" else (op, v) for op, v in clauses}
    texts = {op + v for op, v in clauses}
    if len(canonical) != len(texts):
        return UNDECIDED
    version = _release(running)
    if all(_admits(op, v, version) for op, v in clauses):
        return None
    return ",".join(sorted(texts))
