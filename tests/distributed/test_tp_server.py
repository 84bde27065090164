"""``forkless serve -tp 2`` through the official openai client: the same completions as one
worker; a killed rank fails the requests with an error naming it; the example platform
plugin's own communicator is the one that runs.

One server per module for the first two (the dead-rank test kills it, so it runs last).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from forkless import LLM, SamplingParams
from tests.server.conftest import Server, descendants, kill_during_stream, start_server

pytestmark = pytest.mark.slow
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def tp_server(tp_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tp_models["qwen2"], tmp_path_factory.mktemp("tp-server"), "-tp", "2",
                       "--served-model-name", "tiny")
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def _rank_pid(srv: Server, rank: int) -> int:
    found = re.search(rf"started worker process {rank} \(pid (\d+)\)", srv.log())
    assert found, srv.log()[-3000:]
    return int(found.group(1))


def test_serve_tp2_answers_like_one_worker(tp_server: Server, tp_models: dict[str, Path]) -> None:
    llm = LLM(model=str(tp_models["qwen2"]), max_model_len=128, kv_cache_memory=16 << 20)
    try:
        expected = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    finally:
        llm.shutdown()
    client = tp_server.client(timeout=60)
    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].text == expected[0].outputs[0].text
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5
    assert "rank 1 of 2: TP rank 1 of 2" in tp_server.log()  # two workers, one group


def test_a_killed_rank_fails_requests_with_its_name(tp_server: Server) -> None:
    processes = descendants(tp_server.proc.pid)
    client = tp_server.client(timeout=60)  # a hang fails the test instead of blocking it
    stream = client.completions.create(model="tiny", prompt="Keep going", max_tokens=200, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))  # the request is running on both ranks
    kill_during_stream(tp_server, _rank_pid(tp_server, 1), stream, processes)
    assert re.search(r"worker 1 \(pid \d+\) died", tp_server.log()), tp_server.log()[-3000:]


def test_example_platform_communicator_runs_the_collectives(tp_models: dict[str, Path], plugin_site: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKLESS_PLUGINS_FOR_TESTS", "example_cpu")
    srv = start_server(tp_models["llama"], tmp_path, "-tp", "2", "--served-model-name", "tiny", site=plugin_site,
                       env_extra={"FORKLESS_EXAMPLE_PLATFORM": "1"})
    try:
        got = srv.client(timeout=60).completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0)
        assert got.usage.completion_tokens == 4
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
    log = srv.log()
    assert "communicator CountingGlooCommunicator over gloo" in log, log[-3000:]
    for rank in (0, 1):
        assert f"example_cpu communicator: first all_reduce (group tp, rank {rank} of 2)" in log, log[-3000:]
        totals = re.search(rf"example_cpu communicator totals \(group tp, rank {rank} of 2\): (.*)", log)
        assert totals, log[-3000:]
        counts = dict(item.split("=") for item in totals.group(1).split(", "))
        # Per step and layer: o_proj and the MLP; plus the embedding, and the logits' gather.
        assert int(counts["all_reduce"]) >= 2 * 2 + 1 and int(counts["all_gather"]) >= 1, counts
