"""Property-based fuzzing of the live server from its own OpenAPI schema: never a 5xx.

Schema-valid but unusual inputs (huge integers, odd unicode, empty lists…) and invalid
ones must be refused with a 4xx (with an OpenAI-style body) or served; a 5xx is a bug.
Runs the ``st`` command-line tool, a bounded number of examples per operation.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.server.conftest import Server


def test_fuzzing_the_openapi_schema_finds_no_server_error(server: Server, tmp_path: Path) -> None:
    st = Path(sys.executable).with_name("st")
    proc = subprocess.run(
        [str(st), "run", server.url + "/openapi.json", "--checks", "not_a_server_error",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--workers", "1",
         "--request-timeout", "60", "--wait-for-schema", "30", "--no-color"],
        cwd=tmp_path, capture_output=True, text=True, timeout=540)  # cwd: its example database
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    selected = re.search(r"Selected: (\d+)/(\d+)", proc.stdout)
    assert selected and selected[1] == selected[2] != "0", report  # every route was fuzzed
    assert f"Tested: {selected[1]}" in proc.stdout and " passed" in proc.stdout, report
    assert server.proc.poll() is None  # no fuzzed request took the server down
    r = server.client().completions.create(model="tiny", prompt="after fuzzing", max_tokens=2)
    assert r.usage.completion_tokens == 2
