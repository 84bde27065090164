"""docs/plugins.md quotes the example packages; the quotes must still be true."""

from __future__ import annotations

import re

from forkless.plugins import GROUPS
from tests.conftest import REPO

DOC = (REPO / "docs" / "plugins.md").read_text()


def test_every_quoted_excerpt_matches_its_file() -> None:
    blocks = re.findall(r"```(?:python|toml)\n# (examples/\S+)\n(.*?)```", DOC, flags=re.S)
    assert len(blocks) >= 5
    for path, excerpt in blocks:
        source = (REPO / path).read_text()
        assert excerpt.strip() in source or all(
            line in source for line in excerpt.strip().splitlines()
        ), f"docs/plugins.md quotes {path}, which no longer says:\n{excerpt}"
        # non-contiguous quotes must still keep the file's order
        positions = [source.index(line) for line in excerpt.strip().splitlines() if line.strip()]
        assert positions == sorted(positions), path


def test_every_group_is_documented_and_every_linked_example_exists() -> None:
    for group in GROUPS:
        assert f"`{group}`" in DOC
    linked = set(re.findall(r"\(\.\./examples/plugins/([\w-]+)/\)", DOC))
    assert len(linked) >= 5
    for name in linked:
        assert (REPO / "examples" / "plugins" / name / "pyproject.toml").exists()
    on_disk = {p.name for p in (REPO / "examples" / "plugins").iterdir() if p.is_dir()}
    assert on_disk <= linked, f"examples not described in docs/plugins.md: {on_disk - linked}"
