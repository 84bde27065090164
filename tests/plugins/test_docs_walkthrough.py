"""docs/plugins.md §3.1 and §8, run as written: make the toy model folder with the
example's script, then run the guide's ``try_plugins.py`` (model, attention backend,
scheduler, executor and logits processor packages in one in-process engine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO, plugin_env

DOC = (REPO / "docs" / "plugins.md").read_text()
PLUGINS = "example_model,example_attention,example_executor,example_force_token"


@pytest.mark.slow
def test_make_toy_model_then_try_plugins(plugin_site: Path, smollm2_folder: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS=PLUGINS)
    # The guide's command, with the tokenizer folder given (the session already has it).
    script = EXAMPLES / "forkless-example-model" / "make_toy_model.py"
    assert "$ python examples/plugins/forkless-example-model/make_toy_model.py ./toy-model" in DOC
    proc = subprocess.run([sys.executable, str(script), "./toy-model", str(smollm2_folder)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert '"ToyLlamaForCausalLM"' in (tmp_path / "toy-model" / "config.json").read_text()
    assert list((tmp_path / "toy-model").glob("*.safetensors"))

    (block,) = re.findall(r"```python\n(# try_plugins\.py\n.*?)```", DOC, flags=re.S)
    expected = [line[len("# prints: "):] for line in block.splitlines() if line.startswith("# prints: ")]
    proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected
    # The custom classes really ran: the backend, the scheduler, the executor.
    assert "attention backend naive (forkless_example_attention.backend:NaiveAttentionBackend)" in proc.stderr
    assert "selects the custom class forkless_example_scheduler.ShortPromptScheduler" in proc.stderr
    assert "StepCountingExecutor: 5 steps" in proc.stderr
