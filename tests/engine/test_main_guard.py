"""A script that builds LLM() without ``if __name__ == "__main__":`` fails at once with a
message saying so, instead of waiting forever for a worker that re-ran the script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_an_unguarded_script_with_worker_processes_fails_with_a_clear_message(tiny_llama: Path,
                                                                             tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text("from forkless import LLM\n"
                      f"llm = LLM({str(tiny_llama)!r}, distributed_executor_backend='mp', max_model_len=64)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert 'under `if __name__ == "__main__":`' in proc.stderr
    assert "worker 0" in proc.stderr and "died while starting" in proc.stderr
