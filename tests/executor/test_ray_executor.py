"""``--distributed-executor-backend ray`` on a real two-node Ray cluster on this machine.

The cluster (``ray start --head`` and ``ray start --address ...``, 2 CPUs each, each node
with its own temp dir) is started once for the module with ``--block``: stopping those
two processes stops exactly this cluster's processes (never ``ray stop``, which stops
every Ray process of the machine). Both nodes see the example plugins, as if installed
on every machine; the servers reach the cluster through ``RAY_ADDRESS``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.conftest import plugin_env, run_python
from tests.server.conftest import (alive, children_of, cmdline, descendants, free_port, kill_during_stream,
                                   start_server, stop_and_check, wait_until)

pytest.importorskip("ray", reason="the ray extra (pip install 'forkless[ray]') is not installed")

pytestmark = pytest.mark.slow

PROMPTS = ["Hello", "The capital of France is", "1, 2, 3, 4,"]
_ACTOR_LINE = re.compile(r"worker (\d+): Ray actor pid (\d+) on node (\S+) \((\w+)\)")
_RAY = str(Path(sys.executable).with_name("ray"))
# A Ray instance that ray.init() starts turns token authentication on and writes a token
# to ~/.ray, which every later `ray start` of the machine then requires: the tests say
# which mode they want instead.
NO_TOKEN = {"RAY_AUTH_MODE": "disabled"}


class RayCluster:
    """Two Ray nodes started with ``ray start --block`` (head and worker)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dirs: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.pids: list[int] = []  # every process of the two nodes, for the teardown

    def start_node(self, *args: str) -> None:
        temp = tempfile.mkdtemp(prefix="fkray-")  # short: Ray's socket paths live under it
        self.temp_dirs.append(temp)
        log = open(os.path.join(temp, "ray-start.log"), "wb")
        self.procs.append(subprocess.Popen(
            [_RAY, "start", "--block", "--num-cpus", "2", "--temp-dir", temp, "--object-store-memory", "100000000",
             "--disable-usage-stats", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def query(self, code: str, timeout: float = 120) -> dict:
        """Run ``code`` in a fresh Ray driver connected to the cluster; the JSON it prints last."""
        script = ("import json, ray\nray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n%s\n"
                  "ray.shutdown()\n") % (self.address, code)
        proc = run_python(script, self.env, timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def state(self) -> dict:
        """Alive nodes, total and free CPUs, and placement groups not removed."""
        return self.query(
            "from ray.util import placement_group_table\n"
            "pgs = [p for p in placement_group_table().values() if p['state'] != 'REMOVED']\n"
            "print(json.dumps({'nodes': sum(n['Alive'] for n in ray.nodes()), "
            "'cpus': ray.cluster_resources().get('CPU', 0), 'free_cpus': ray.available_resources().get('CPU', 0), "
            "'placement_groups': len(pgs)}))")

    def stop(self) -> None:
        self.pids = sorted({p for proc in self.procs for p in descendants(proc.pid)} | set(self.pids))
        for proc in reversed(self.procs):  # the worker node first, then the head
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for pid in self.pids:  # whatever of this cluster outlived its `ray start`
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for temp in self.temp_dirs:
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster(plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    env = plugin_env(plugin_site, tmp_path_factory.mktemp("ray-env"), RAY_USAGE_STATS_ENABLED="0", **NO_TOKEN)
    cluster = RayCluster(env)
    try:
        cluster.start_node("--head", "--port", str(cluster.port), "--include-dashboard=false")
        cluster.start_node("--address", cluster.address)
        assert wait_until(lambda: cluster.state()["nodes"] == 2, 120, 1), "the worker node did not join"
        yield cluster
    finally:
        cluster.stop()


def ray_env(cluster: RayCluster, **extra: str) -> dict[str, str]:
    return {"RAY_ADDRESS": cluster.address, **NO_TOKEN, **extra}


def actors(log: str) -> dict[int, tuple[int, str]]:
    """``{rank: (pid, node id prefix)}`` from the executor's start-up lines."""
    return {int(m[1]): (int(m[2]), m[4]) for m in _ACTOR_LINE.finditer(log)}


def completions(srv, **kwargs) -> list[str]:
    client = srv.client(timeout=120)
    out = [client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0, **kwargs).choices[0].text
           for p in PROMPTS]
    batch = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0, **kwargs)
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == out
    return out


def served_by_mp(model: Path, tmp_path: Path, *args: str) -> list[str]:
    srv = start_server(model, tmp_path, "--served-model-name", "tiny", "--distributed-executor-backend", "mp", *args)
    try:
        return completions(srv)
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def mp_outputs(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return served_by_mp(tiny_llama, tmp_path_factory.mktemp("mp"))


LOCAL_RAY = '''
import json, sys
sys.path.insert(0, {repo!r})
from forkless import LLM, SamplingParams
from tests.server.conftest import descendants

if __name__ == "__main__":
    llm = LLM({model!r}, distributed_executor_backend="ray", max_model_len=256, kv_cache_memory=32 << 20)
    outs = llm.generate({prompts!r}, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    started = descendants(__import__("os").getpid())  # the Ray instance this process started
    llm.llm_engine.shutdown()
    print(json.dumps({{"texts": [o.outputs[0].text for o in outs], "ray_processes": started}}))
'''


def test_without_a_cluster_the_engine_starts_a_ray_instance_of_its_own_and_stops_it(
        mp_outputs: list[str], tiny_llama: Path, tmp_path: Path) -> None:
    # No RAY_ADDRESS and no cluster that `ray start` started in this Ray temp dir: the
    # offline engine starts a local Ray instance, runs its worker there, and stops it at
    # shutdown.
    script = tmp_path / "local_ray.py"
    script.write_text(LOCAL_RAY.format(repo=str(Path(__file__).parents[2]), model=str(tiny_llama), prompts=PROMPTS))
    ray_tmp = tempfile.mkdtemp(prefix="fkray-")  # the instance's files, not /tmp/ray's (short: socket paths)
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                              env=plugin_env(None, tmp_path, RAY_ADDRESS=None, RAY_TMPDIR=ray_tmp, **NO_TOKEN))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "no Ray cluster to join (RAY_ADDRESS is unset and `ray start` started none here): starting a local one" \
        in proc.stderr
    assert report["texts"] == mp_outputs
    assert report["ray_processes"]  # its GCS, raylet...: children of the engine's process
    assert wait_until(lambda: not any(alive(p) for p in report["ray_processes"]), 30), \
        [p for p in report["ray_processes"] if alive(p)]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_ray_serves_the_greedy_completions_of_mp_with_the_plugins_loaded_in_the_actor(
        async_scheduling: bool, ray_cluster: RayCluster, mp_outputs: list[str], tiny_llama: Path,
        plugin_site: Path, tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    flags = ["--async-scheduling"] if async_scheduling else []
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--distributed-executor-backend", "ray",
                       *flags, site=plugin_site,
                       env_extra=ray_env(ray_cluster, FORKLESS_PLUGINS="example_model",
                                         FORKLESS_EXAMPLE_RECORD_DIR=str(records)))
    try:
        assert completions(srv) == mp_outputs
        ((rank, (pid, _)),) = actors(srv.log()).items()
        assert rank == 0
        assert pid not in descendants(srv.proc.pid)  # the worker runs in Ray's process, not below the server
        # The general plugin ran in the actor's process, loaded by the actor itself.
        events = [json.loads(line) for line in (records / f"{pid}.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events] == ["registered"]
        if async_scheduling:
            assert "--async-scheduling is not supported" not in srv.log()
        assert ray_cluster.state()["placement_groups"] == 1  # one bundle reserved while serving
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]
    assert not alive(pid)  # shutdown killed the actor
    state = ray_cluster.state()
    assert (state["placement_groups"], state["free_cpus"]) == (0, state["cpus"]), state


@pytest.mark.parametrize("tp", [1, 2])
def test_killed_actor_fails_the_request_within_seconds_and_leaves_nothing_behind(
        tp: int, ray_cluster: RayCluster, tiny_llama: Path, tmp_path: Path) -> None:
    # With -tp 2 the last rank is killed, on the other node: rank 0 is then waiting for it
    # in a collective, and must not hold the request up.
    srv = start_server(tiny_llama, tmp_path, "--max-model-len", "512", "--distributed-executor-backend", "ray",
                       "-tp", str(tp),
                       env_extra=ray_env(ray_cluster, FORKLESS_RAY_PLACEMENT_STRATEGY="STRICT_SPREAD"))
    processes = descendants(srv.proc.pid)
    try:
        ranks = actors(srv.log())
        assert sorted(ranks) == list(range(tp))
        pid = ranks[tp - 1][0]
        client = srv.client(timeout=60)  # a hang fails the test instead of blocking it
        stream = client.completions.create(model=str(tiny_llama), prompt="Keep going", max_tokens=480,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the request is running
        kill_during_stream(srv, pid, stream, processes, fails_within=10, gone_within=15)
        assert re.search(rf"worker {tp - 1} \(Ray actor, pid {pid} on node \S+\) died while the engine was running",
                         srv.log())
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert not any(alive(p) for p, _ in ranks.values())
    state = ray_cluster.state()
    assert (state["nodes"], state["placement_groups"], state["free_cpus"]) == (2, 0, state["cpus"]), state




def test_an_actor_killed_while_the_engine_is_idle_fails_it_within_seconds(ray_cluster: RayCluster, tiny_llama: Path,
                                                                         tmp_path: Path) -> None:
    # Nothing in flight, nothing coming: the executor's watch pings the actors (an idle
    # engine would otherwise learn of the death only at its next request, /health 200 meanwhile).
    srv = start_server(tiny_llama, tmp_path, "--max-model-len", "512", "--distributed-executor-backend", "ray",
                       "--served-model-name", "tiny", env_extra=ray_env(ray_cluster))
    processes = descendants(srv.proc.pid)
    try:
        (pid, _), = actors(srv.log()).values()
        assert completions(srv)
        os.kill(pid, signal.SIGKILL)

        def unhealthy() -> bool:
            try:
                return httpx.get(srv.url + "/health", timeout=5).status_code == 503
            except httpx.HTTPError:
                return True  # already shutting down
        assert wait_until(unhealthy, 15, 0.1)
        assert srv.proc.wait(60) != 0  # the server notices and shuts itself down
        assert re.search(rf"worker 0 \(Ray actor, pid {pid} on node \S+\) died while the engine was running",
                         srv.log()), srv.log()[-3000:]
        assert wait_until(lambda: not any(alive(p) for p in processes), 15)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    state = ray_cluster.state()
    assert (state["placement_groups"], state["free_cpus"]) == (0, state["cpus"]), state


def test_tp2_on_ray_puts_one_rank_on_each_node_and_serves_the_completions_of_mp_tp2(
        ray_cluster: RayCluster, tiny_llama: Path, plugin_site: Path, tmp_path: Path) -> None:
    (tmp_path / "mp").mkdir()
    expected = served_by_mp(tiny_llama, tmp_path / "mp", "-tp", "2")
    records = tmp_path / "records"
    records.mkdir()
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--distributed-executor-backend", "ray",
                       "-tp", "2", "--async-scheduling", site=plugin_site,
                       env_extra=ray_env(ray_cluster, FORKLESS_RAY_PLACEMENT_STRATEGY="STRICT_SPREAD",
                                         FORKLESS_PLUGINS="example_model", FORKLESS_EXAMPLE_RECORD_DIR=str(records)))
    try:
        assert completions(srv) == expected
        ranks = actors(srv.log())
        assert sorted(ranks) == [0, 1]
        assert ranks[0][1] != ranks[1][1]  # one rank on each node
        for pid, _ in ranks.values():  # the general plugin loaded in both actors
            assert [json.loads(line)["event"] for line in (records / f"{pid}.jsonl").read_text().splitlines()] \
                == ["registered"]
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]
    assert not any(alive(pid) for pid, _ in ranks.values())
    state = ray_cluster.state()
    assert (state["placement_groups"], state["free_cpus"]) == (0, state["cpus"]), state


def test_ranks_the_cluster_cannot_place_fail_the_start_naming_what_is_missing(
        ray_cluster: RayCluster, tiny_llama: Path, tmp_path: Path) -> None:
    # Four ranks, one per node, on two nodes: Ray can never place them.
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="", FORKLESS_RAY_PLACEMENT_STRATEGY="STRICT_SPREAD",
                     FORKLESS_RAY_PLACEMENT_TIMEOUT="3", **ray_env(ray_cluster))
    proc = subprocess.run(
        [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama), "--port", str(free_port()),
         "--max-model-len", "256", "--kv-cache-memory", str(32 << 20), "--distributed-executor-backend", "ray",
         "-tp", "4"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert ("the Ray cluster could not place 4 bundle(s) {'CPU': 1.0} (STRICT_SPREAD) on a cluster of 2 node(s)"
            in proc.stderr), proc.stderr[-3000:]
    assert "within 3 s (FORKLESS_RAY_PLACEMENT_TIMEOUT)" in proc.stderr
    state = ray_cluster.state()
    assert (state["placement_groups"], state["free_cpus"]) == (0, state["cpus"]), state


def test_killed_engine_core_leaves_no_actor_nor_placement_group(ray_cluster: RayCluster, tiny_llama: Path,
                                                                 tmp_path: Path) -> None:
    # The engine core is the actors' owner: when it is SIGKILLed (no shutdown runs), Ray
    # itself removes its actors and its placement group.
    srv = start_server(tiny_llama, tmp_path, "--distributed-executor-backend", "ray", env_extra=ray_env(ray_cluster))
    try:
        ((_, (pid, _)),) = actors(srv.log()).items()
        (engine_core,) = [c for c in children_of(srv.proc.pid) if "resource_tracker" not in cmdline(c)]
        os.kill(engine_core, signal.SIGKILL)
        assert srv.proc.wait(60) != 0  # the API server notices its engine is gone
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert wait_until(lambda: not alive(pid), 30)

    def released() -> bool:
        state = ray_cluster.state()
        return (state["placement_groups"], state["free_cpus"]) == (0, state["cpus"])

    assert wait_until(released, 60, 2), ray_cluster.state()


def test_each_node_s_actors_see_the_node_s_devices_and_index_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU placement logic, which a CPU machine cannot run for real: Ray gives each actor
    # one GPU id; every actor of a node then sees all of that node's ids (numerically
    # ordered) and its local_rank indexes its own; the engine core's FORKLESS_* variables go
    # to every rank.
    from forkless.executor.ray_executor import RayExecutor

    monkeypatch.setenv("FORKLESS_SOMETHING", "x")
    executor = RayExecutor.__new__(RayExecutor)
    executor.actor_info = [{"node_id": "a", "devices": {"GPU": ["10"]}}, {"node_id": "a", "devices": {"GPU": ["9"]}},
                           {"node_id": "b", "devices": {"GPU": ["0"]}}]
    local_ranks, envs_by_rank = executor._placement_env("GPU", "CUDA_VISIBLE_DEVICES", ())
    assert local_ranks == [1, 0, 0]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs_by_rank] == ["9,10", "9,10", "0"]
    assert all(e["FORKLESS_SOMETHING"] == "x" for e in envs_by_rank)
    # CPU bundles: the place among the node's ranks, no device variable.
    executor.actor_info = [{"node_id": "a", "devices": {}}, {"node_id": "b", "devices": {}},
                           {"node_id": "a", "devices": {}}]
    local_ranks, envs_by_rank = executor._placement_env("CPU", "", ())
    assert local_ranks == [0, 0, 1]
    assert not any("CUDA_VISIBLE_DEVICES" in e for e in envs_by_rank)


DEFERRED = '''
import json
from forkless import LLM, SamplingParams, StructuredOutputsParams

if __name__ == "__main__":
    prompts = ["The capital of France is", "Is the sky blue? Answer:", "Hello"]
    constrained = [StructuredOutputsParams(choice=["yes", "no", "maybe so"]),
                   StructuredOutputsParams(regex="[a-z ]{{40,80}}")]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] + [
        SamplingParams(temperature=0, max_tokens=12, structured_outputs=c) for c in constrained]
    llm = LLM({model!r}, max_model_len=256, kv_cache_memory=32 << 20, distributed_executor_backend={backend!r},
              async_scheduling={backend!r} == "ray")
    executor = llm.llm_engine.engine_core.executor
    deferred = []
    if {backend!r} == "ray":
        sample = executor.sample_deferred
        executor.sample_deferred = lambda handle, mask: (deferred.append(mask is not None), sample(handle, mask))
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.shutdown()
    print(json.dumps({{"tokens": [list(o.outputs[0].token_ids) for o in outs], "deferred": deferred}}))
'''


def test_structured_outputs_overlap_on_ray_with_deferred_sampling(ray_cluster: RayCluster, tiny_llama: Path,
                                                                   tmp_path: Path) -> None:
    # Under --async-scheduling constrained requests keep overlapping on Ray: the actors
    # launch a step before its bitmask exists and sample it when sample_deferred brings it.
    # Tokens are those of mp's synchronous steps.
    def run(backend: str) -> dict:
        script = tmp_path / f"deferred_{backend}.py"  # not ray.py: it would hide the package
        script.write_text(DEFERRED.format(model=str(tiny_llama), backend=backend))
        # FORKLESS_PLUGINS="" reaches the actor: the nodes have the example plugins, whose
        # logits processor would turn async scheduling off.
        env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="", **ray_env(ray_cluster))
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    on_ray = run("ray")
    assert on_ray["tokens"] == run("mp")["tokens"]
    # Steps overlapped (the regex request alone runs 12 constrained steps), bitmasks applied late.
    assert len(on_ray["deferred"]) >= 5 and any(on_ray["deferred"]), on_ray


PIPELINED = '''
import json
from forkless import LLM, SamplingParams

if __name__ == "__main__":
    prompts = ["The capital of France is", "Is the sky blue? Answer:", "Hello", "Numbers 0123", "Once upon a time"]
    llm = LLM({model!r}, max_model_len=256, kv_cache_memory=32 << 20, distributed_executor_backend={backend!r},
              pipeline_parallel_size=2)
    executor = llm.llm_engine.engine_core.executor
    launch, collect, count = executor.execute_model_async, executor.collect, {{"now": 0, "peak": 0}}
    def counted_launch(plan):
        count["now"] += 1
        count["peak"] = max(count["peak"], count["now"])
        return launch(plan)
    def counted_collect(handle):
        count["now"] -= 1
        return collect(handle)
    executor.execute_model_async, executor.collect = counted_launch, counted_collect
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    llm.shutdown()
    print(json.dumps({{"tokens": [list(o.outputs[0].token_ids) for o in outs], "peak": count["peak"]}}))
'''


def test_pipeline_stages_on_ray_keep_two_micro_batches_and_the_tokens_of_mp(ray_cluster: RayCluster,
                                                                            tiny_llama: Path, tmp_path: Path) -> None:
    # -pp 2: only the last stage samples (rank 1's output is the step's), and the engine
    # keeps a micro-batch in flight per stage on Ray's actors as on mp's processes.
    def run(backend: str) -> dict:
        script = tmp_path / f"pipelined_{backend}.py"
        script.write_text(PIPELINED.format(model=str(tiny_llama), backend=backend))
        env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="", **ray_env(ray_cluster))
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    on_ray, on_mp = run("ray"), run("mp")
    assert on_ray["tokens"] == on_mp["tokens"]
    assert on_ray["peak"] == on_mp["peak"] == 2


def test_plugin_loading_rules_hold_in_the_actors(ray_cluster: RayCluster, tiny_llama: Path, tmp_path: Path) -> None:
    # The nodes have the example plugins, forkless-example-broken among them; the server's
    # own processes have none. FORKLESS_PLUGINS_STRICT=1 reaches the actors, where the
    # broken plugin then aborts the worker's start: the server fails naming it.
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS=None, FORKLESS_PLUGINS_STRICT="1", **ray_env(ray_cluster))
    proc = subprocess.run(
        [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama), "--port", str(free_port()),
         "--max-model-len", "256", "--kv-cache-memory", str(32 << 20), "--distributed-executor-backend", "ray"],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert re.search(r"worker 0 failed to start: PluginLoadError: \d plugin\(s\) failed and FORKLESS_PLUGINS_STRICT=1 "
                     r"aborts startup", proc.stderr), proc.stderr[-3000:]
    assert "'broken_call'" in proc.stderr
    state = ray_cluster.state()
    assert (state["placement_groups"], state["free_cpus"]) == (0, state["cpus"]), state
