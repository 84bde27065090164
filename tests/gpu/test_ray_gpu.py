"""``--distributed-executor-backend ray`` on CUDA: the actor holds a ``{"GPU": 1}`` bundle and
serves the greedy tokens of ``mp`` (CUDA graphs and async scheduling on)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import plugin_env

pytest.importorskip("ray", reason="the ray extra (pip install 'forkless[ray]') is not installed")

SCRIPT = '''
import json
from forkless import LLM, SamplingParams

if __name__ == "__main__":
    import random
    rng = random.Random(0)
    prompts = [{{"prompt_token_ids": [rng.randrange(100, 151936) for _ in range(rng.randint(5, 90))]}}
               for _ in range(6)]
    llm = LLM({model!r}, dtype="float32", max_model_len=256, kv_cache_memory=1 << 30, max_num_seqs=8,
              distributed_executor_backend={backend!r}, async_scheduling=True)
    report = {{}}
    if {backend!r} == "ray":
        import ray
        report["gpus"] = ray.cluster_resources().get("GPU", 0)
        report["free_gpus"] = ray.available_resources().get("GPU", 0)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    report["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    llm.shutdown()
    print(json.dumps(report))
'''


def _run(model: Path, backend: str, tmp_path: Path) -> dict:
    script = tmp_path / f"run_{backend}.py"  # not ray.py: it would hide the package
    script.write_text(SCRIPT.format(model=str(model), backend=backend))
    # No RAY_ADDRESS: the executor starts a Ray instance of its own (token auth left off,
    # so no token is written to ~/.ray).
    ray_tmp = tempfile.mkdtemp(prefix="fkray-")  # the instance's files (short: socket paths)
    env = plugin_env(None, tmp_path, RAY_ADDRESS=None, RAY_AUTH_MODE="disabled", RAY_TMPDIR=ray_tmp)
    try:
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_ray_actor_on_a_gpu_bundle_serves_the_tokens_of_mp(real_size_model, tmp_path: Path) -> None:
    ray_run = _run(real_size_model, "ray", tmp_path)
    assert ray_run["gpus"] >= 1 and ray_run["free_gpus"] == ray_run["gpus"] - 1  # one GPU bundle held
    assert ray_run["tokens"] == _run(real_size_model, "mp", tmp_path)["tokens"]
