"""A KV connector written for vLLM runs by renaming its imports: vLLM's constructor keywords,
``_vllm_config``, ``KVCacheBlocks.get_block_ids()``, ``SchedulerOutput``'s
``scheduled_new_reqs`` / ``scheduled_cached_reqs`` / ``num_scheduled_tokens``, and
``kv_transfer_params`` both ways (the client's in ``request.kv_transfer_params``, what
``request_finished`` returns in the finished output and the response)."""

from __future__ import annotations

import json
from pathlib import Path

from forkless import LLM, SamplingParams
from tests.server.conftest import start_server, stop_and_check

HERE = Path(__file__).resolve().parent
CONNECTOR = {"kv_connector": "RecordingConnector", "kv_role": "kv_both",
             "kv_connector_module_path": "vllm_style_kv_connector"}


def test_the_sample_imports_only_vllms_paths_renamed() -> None:
    source = (HERE / "vllm_style_kv_connector.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("from forkless", "import forkless"))]
    assert imports and all("kv_transfer.kv_connector.v1.base" in line for line in imports)


def test_a_vllm_style_connector_sees_each_step_as_vllms_does(tiny_llama: Path, tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    record = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=16 << 20, block_size=16,
              kv_transfer_config={**CONNECTOR, "kv_connector_extra_config": {"record_path": str(record)}})
    try:
        prompts = ["Hello there, how are you today? " * 3, "Paris is"]
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
        steps = [json.loads(line) for line in record.read_text().splitlines()]
        # vLLM's place for the client's parameters, and the connector's answer in the output.
        asked = {"do_remote_decode": True}
        (handed,) = llm.generate(["Paris is"], SamplingParams(max_tokens=2, extra_args={"kv_transfer_params": asked}),
                                 use_tqdm=False)
    finally:
        llm.shutdown()
    assert out[0].kv_transfer_params is None  # none asked, none returned
    assert handed.kv_transfer_params["asked"] == asked and handed.kv_transfer_params["remote_block_ids"]
    first = steps[0]
    assert sorted(len(o.prompt_token_ids) for o in out) == sorted(n[1] for n in first["new"])
    for req_id, prompt_len, block_ids, computed in first["new"]:
        # The blocks the scheduler side was told at allocation are the table the step runs on.
        assert first["allocated"][req_id] == block_ids and len(block_ids) * 16 >= prompt_len
        assert computed == 0 and first["tokens"][req_id] == prompt_len
    # Then each request decodes as a cached request, one token a step.
    later = [s for s in steps[1:] if s["cached"]]
    assert len(later) == 3 and all(sorted(s["cached"]) == sorted(n[0] for n in first["new"]) for s in later)
    assert all(set(s["tokens"].values()) == {1} for s in later)


def test_kv_transfer_params_reach_the_connector_and_come_back_in_the_response(tiny_llama: Path,
                                                                              tmp_path: Path) -> None:
    config = {**CONNECTOR, "kv_connector_extra_config": {"record_path": str(tmp_path / "steps.jsonl")}}
    server = start_server(tiny_llama, tmp_path, "--kv-transfer-config", json.dumps(config), site=HERE)
    try:
        client = server.client()
        model = client.models.list().data[0].id
        asked = {"do_remote_decode": True, "tag": "chat"}
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                              extra_body={"kv_transfer_params": asked})
        assert chat.model_extra["kv_transfer_params"]["asked"] == asked
        # Completions: the first prompt's (a connector pairs one request with another engine's).
        done = client.completions.create(model=model, prompt=["Paris is", "Rome is the"], max_tokens=2,
                                         extra_body={"kv_transfer_params": {"tag": "completion"}})
        handed = done.model_extra["kv_transfer_params"]
        assert handed["asked"] == {"tag": "completion"} and len(handed["remote_block_ids"]) == 1
        plain = client.completions.create(model=model, prompt="Paris is", max_tokens=2)
        assert plain.model_extra["kv_transfer_params"] is None
        # A stream takes them too (the connector reads them); its chunks carry none.
        chunks = list(client.completions.create(model=model, prompt="Paris is", max_tokens=2, stream=True,
                                                extra_body={"kv_transfer_params": {"tag": "stream"}}))
        assert "".join(c.choices[0].text for c in chunks if c.choices)
    finally:
        assert stop_and_check(server) == 0, server.log()[-3000:]
