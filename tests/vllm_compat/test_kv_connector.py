"""A KV connector written for vLLM runs by renaming its imports: vLLM's constructor keywords,
``_vllm_config``, ``KVCacheBlocks.get_block_ids()``, and ``SchedulerOutput``'s
``scheduled_new_reqs`` / ``scheduled_cached_reqs`` / ``num_scheduled_tokens``."""

from __future__ import annotations

import json
from pathlib import Path

from forkless import LLM, SamplingParams

HERE = Path(__file__).resolve().parent


def test_the_sample_imports_only_vllms_paths_renamed() -> None:
    source = (HERE / "vllm_style_kv_connector.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("from forkless", "import forkless"))]
    assert imports and all("kv_transfer.kv_connector.v1.base" in line for line in imports)


def test_a_vllm_style_connector_sees_each_step_as_vllms_does(tiny_llama: Path, tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    record = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=16 << 20, block_size=16,
              kv_transfer_config={"kv_connector": "RecordingConnector", "kv_role": "kv_both",
                                  "kv_connector_module_path": "vllm_style_kv_connector",
                                  "kv_connector_extra_config": {"record_path": str(record)}})
    try:
        prompts = ["Hello there, how are you today? " * 3, "Paris is"]
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    finally:
        llm.shutdown()
    steps = [json.loads(line) for line in record.read_text().splitlines()]
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
