"""forkless without Ray: ``ray`` is an optional extra (``pip install 'forkless[ray]'``)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import plugin_env, run_python


def test_ray_is_optional(tmp_path: Path) -> None:
    # forkless imports and resolves the other executors with Ray hidden; choosing ray says
    # what to install.
    code = ("import sys; sys.modules['ray'] = None\n"
            "import forkless\n"
            "from forkless.executor import available_executors, get_executor_cls\n"
            "assert 'ray' in available_executors() and get_executor_cls('mp').__name__ == 'MultiprocExecutor'\n"
            "try:\n    get_executor_cls('ray')\nexcept ImportError as exc:\n    print(exc)\n"
            "else:\n    raise SystemExit('ray resolved without Ray')\n")
    proc = run_python(code, plugin_env(None, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "--distributed-executor-backend ray needs Ray: pip install 'forkless[ray]'" in proc.stdout
