"""Malformed adapters are clear errors naming the adapter and the problem; the engine lives on.
Also: --max-loras smaller than the adapters in flight, and --max-cpu-loras eviction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forkless import LLM, SamplingParams
from forkless.lora import LoRARequest
from tests.lora.conftest import make_adapter, make_base

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = ["The quick brown fox", "Paris is the capital of"]


@pytest.fixture(scope="module")
def llama(lora_models):
    return lora_models["llama"]


@pytest.fixture(scope="module")
def llm(llama):
    base, _ = llama
    engine = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=16, max_model_len=128, max_num_seqs=8)
    yield engine
    engine.shutdown()


def _copy(src: Path, dst: Path, **config_changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(config_changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


def _bad_cases(llama, tmp: Path) -> dict[str, tuple[Path, str]]:
    base, adapters = llama
    good = adapters["all-r8"]
    other_base = make_base(tmp / "other-base", "llama", hidden_size=32, intermediate_size=64)
    bin_only = _copy(good, tmp / "bin-only")
    (bin_only / "adapter_model.safetensors").rename(bin_only / "adapter_model.bin")
    no_config = _copy(good, tmp / "no-config")
    (no_config / "adapter_config.json").unlink()
    garbage = _copy(good, tmp / "garbage")
    (garbage / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    return {
        "too-big": (adapters["mlp-o-r32"], "rank r=32 is above --max-lora-rank 16"),
        "unknown-module": (_copy(good, tmp / "unknown", target_modules=["q_proj", "lm_head"]),
                           "target module 'lm_head' is not supported"),
        "wrong-shapes": (make_adapter(other_base, tmp / "wrong-shapes", 8, 16, False, ["q_proj"]),
                         "is 32 -> 32 in the adapter but 64 -> 64 in the model"),
        "missing": (tmp / "does-not-exist", "no such folder"),
        "bin-only": (bin_only, "adapter_model.bin"),
        "no-config": (no_config, "no adapter_config.json"),
        "garbage": (garbage, "adapter_model.safetensors:"),
        "dora": (_copy(good, tmp / "dora", use_dora=True), "use_dora=True is not supported"),
    }


def test_malformed_adapters_are_clear_errors(llm, llama, tmp_path):
    expected = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for i, (name, (path, problem)) in enumerate(_bad_cases(llama, tmp_path).items()):
        with pytest.raises(ValueError) as info:
            llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=LoRARequest(name, 100 + i, str(path)))
        message = str(info.value)
        assert f"LoRA adapter {name!r}" in message and problem in message, message
    # Nothing reached the engine: it still serves.
    again = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in expected]


def test_lora_request_without_enable_lora(llama):
    base, adapters = llama
    engine = LLM(str(base), max_model_len=128, max_num_seqs=4)
    try:
        with pytest.raises(ValueError, match="--enable-lora"):
            engine.generate(PROMPTS, GREEDY, use_tqdm=False,
                            lora_request=LoRARequest("a", 1, str(adapters["all-r8"])))
    finally:
        engine.shutdown()


def test_bad_lora_request_values():
    with pytest.raises(ValueError, match="lora_int_id must be an integer >= 1"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(ValueError, match="lora_name must be a non-empty string"):
        LoRARequest("", 1, "/x")


def test_more_adapters_than_slots_and_host_cache(llama, llm):
    """4 adapters in one batch with --max-loras 1 and --max-cpu-loras 2: requests for an
    adapter wait for a slot, adapters are evicted and reloaded, and every output is what it
    is alone (on an engine with room for all of them)."""
    base, adapters = llama
    names = ["all-r8", "qv-r16-rslora", "all-r8-again", "qv-r16-rslora-again"]
    paths = [adapters["all-r8"], adapters["qv-r16-rslora"]] * 2
    loras = [LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(zip(names, paths))]
    alone = {lora.lora_name: [o.outputs[0].token_ids for o in
                              llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=lora)]
             for lora in loras}
    tight = LLM(str(base), enable_lora=True, max_loras=1, max_cpu_loras=2, max_lora_rank=16,
                max_model_len=128, max_num_seqs=8)
    try:
        prompts = [p for p in PROMPTS for _ in loras] * 2
        per_prompt = [lora for _ in PROMPTS for lora in loras] * 2
        out = tight.generate(prompts, GREEDY, use_tqdm=False, lora_request=per_prompt)
        for i, (o, lora) in enumerate(zip(out, per_prompt)):
            assert o.outputs[0].token_ids == alone[lora.lora_name][(i // len(loras)) % len(PROMPTS)]
        runner = tight.llm_engine.engine_core.executor.worker.model_runner
        manager = runner.lora_manager
        assert manager.evictions >= 2 and len(manager.loaded_ids()) == 2
        stats = tight.llm_engine.engine_core.make_stats()  # the worker's counts reach the stats
        assert (stats.lora_loads, stats.lora_evictions) == (manager.loads, manager.evictions)
    finally:
        tight.shutdown()


def test_lora_stats_and_prometheus_info(llm, llama):
    """Per-adapter running/waiting counts reach SchedulerStats and forkless:lora_requests_info."""
    from forkless.metrics.prometheus import PrometheusStatLogger

    _, adapters = llama
    engine = llm.llm_engine
    names = ["s-a", "s-b", "s-c"]  # --max-loras 2: the third waits for a slot
    loras = [LoRARequest(n, 50 + i, str(adapters["all-r8"])) for i, n in enumerate(names)]
    for i, lora in enumerate(loras):
        engine.add_request(f"stats-{i}", PROMPTS[0], GREEDY, lora_request=lora)
    stats = engine.engine_core.make_stats()
    assert stats.waiting_lora_adapters == {"s-a": 1, "s-b": 1, "s-c": 1} and not stats.running_lora_adapters
    engine.step()
    stats = engine.engine_core.make_stats()
    assert stats.running_lora_adapters == {"s-a": 1, "s-b": 1} and stats.waiting_lora_adapters == {"s-c": 1}
    logger = PrometheusStatLogger(engine.config.model_config, max_loras=engine.config.lora_config.max_loras)
    logger.record(stats, None)
    text = logger.render().decode()
    assert 'max_lora="2"' in text and 'running_lora_adapters="s-a,s-b"' in text
    assert 'waiting_lora_adapters="s-c"' in text and "forkless:lora_requests_info" in text
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.engine_core.make_stats()
    assert not stats.running_lora_adapters and not stats.waiting_lora_adapters
    assert stats.lora_loads >= 1
    logger.record(stats, None)
    assert "forkless:lora_loads_total" in logger.render().decode()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_worker_load_failure_fails_only_its_requests(llama, monkeypatch, async_scheduling):
    """An adapter that passes the engine's check but fails to load in the worker (changed on
    disk since, say) fails its own requests with the reason; the step's other requests and
    the engine go on."""
    from forkless.lora import layers
    from forkless.lora.peft import LoRAAdapterError

    base, adapters = llama
    real = layers.LoRAModelManager.add_adapter

    def add_adapter(self, lora):
        if lora.lora_name == "flaky":
            raise LoRAAdapterError("LoRA adapter 'flaky': simulated read failure")
        return real(self, lora)

    # The offline engine's worker runs in this process (the uni executor): the patch reaches it.
    monkeypatch.setattr(layers.LoRAModelManager, "add_adapter", add_adapter)
    engine = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=16, max_model_len=128, max_num_seqs=8,
                 async_scheduling=async_scheduling)
    try:
        good = LoRARequest("good", 1, str(adapters["all-r8"]))
        flaky = LoRARequest("flaky", 2, str(adapters["qv-r16-rslora"]))
        want = [list(o.outputs[0].token_ids)
                for o in engine.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=good)]
        eng = engine.llm_engine
        eng.add_request("g0", PROMPTS[0], GREEDY, lora_request=good)
        eng.add_request("f0", PROMPTS[0], GREEDY, lora_request=flaky)
        eng.add_request("g1", PROMPTS[1], GREEDY, lora_request=good)
        finished: dict[str, list[int]] = {}
        errors: list[str] = []
        while eng.has_unfinished_requests():
            try:
                for out in eng.step():
                    if out.finished:
                        finished[out.request_id] = list(out.outputs[0].token_ids)
            except ValueError as exc:
                errors.append(str(exc))
        assert len(errors) == 1, errors
        assert "'f0'" in errors[0] and "'flaky'" in errors[0] and "simulated read failure" in errors[0]
        assert finished == {"g0": want[0], "g1": want[1]}
        # An offline call with such a request fails with the reason; the engine lives on.
        with pytest.raises(ValueError, match="simulated read failure"):
            engine.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=[good, flaky])
        again = engine.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=good)
        assert [list(o.outputs[0].token_ids) for o in again] == want
    finally:
        engine.shutdown()


def test_one_id_for_two_adapter_folders_is_refused(llm, llama):
    # The workers cache adapters by lora_int_id: a second folder under the same id would
    # silently run the first one's weights.
    _, adapters = llama
    first = LoRARequest("first", 77, str(adapters["all-r8"]))
    expected = llm.generate(PROMPTS[:1], GREEDY, lora_request=first, use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="has lora_int_id 77, which adapter 'first' .* already has"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("second", 77, str(adapters["qv-r16-rslora"])),
                     use_tqdm=False)
    renamed = LoRARequest("first-again", 77, str(adapters["all-r8"]))  # the same folder: the same adapter
    assert llm.generate(PROMPTS[:1], GREEDY, lora_request=renamed, use_tqdm=False)[0].outputs[0].token_ids == expected


def test_load_inplace_rereads_the_adapter_under_its_id(llm, llama, tmp_path):
    # vLLM's load_inplace: an RL loop writes a new checkpoint into the same folder and asks
    # for it under the same id; without the flag the cached weights stay.
    _, adapters = llama
    folder = shutil.copytree(adapters["all-r8"], tmp_path / "rl-checkpoint")
    first_out = llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("rl", 90, str(folder)),
                             use_tqdm=False)[0]
    assert first_out.lora_request == LoRARequest("rl", 90, str(folder))  # vLLM's RequestOutput.lora_request
    first = first_out.outputs[0].token_ids
    other = llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("other", 91, str(adapters["qv-r16-rslora"])),
                         use_tqdm=False)[0].outputs[0].token_ids
    assert first != other
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 4  # whole blocks in the prefix cache
    long_first = llm.generate(long_prompt, GREEDY, lora_request=LoRARequest("rl", 90, str(folder)),
                              use_tqdm=False)[0].outputs[0].token_ids
    long_other = llm.generate(long_prompt, GREEDY, lora_request=LoRARequest("other", 91, str(adapters["qv-r16-rslora"])),
                              use_tqdm=False)[0].outputs[0].token_ids
    shutil.rmtree(folder)
    shutil.copytree(adapters["qv-r16-rslora"], folder)
    cached = llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("rl", 90, str(folder)),
                          use_tqdm=False)[0].outputs[0].token_ids
    assert cached == first
    reloaded = llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("rl", 90, str(folder), load_inplace=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    assert reloaded == other
    # The prefix cache's blocks of the earlier weights are not read for the new ones.
    again = llm.generate(long_prompt, GREEDY, lora_request=LoRARequest("rl", 90, str(folder)), use_tqdm=False)[0]
    assert again.outputs[0].token_ids == long_other != long_first and again.num_cached_tokens == 0
    with pytest.raises(ValueError, match="tensorizer_config_dict is not supported"):
        LoRARequest("t", 92, str(folder), tensorizer_config_dict={"x": 1})


def test_adapters_checked_from_many_threads(llm, monkeypatch):
    """The API server checks adapters in threads (each /v1/load_lora_adapter, each name a
    resolver finds): concurrent checks of new adapters must not trip over one another (they
    raised "Set changed size during iteration", a 500) nor get slower with every adapter
    ever checked; an unloaded adapter's id is forgotten."""
    import threading

    from forkless.engine.processor import Processor
    from forkless.lora import peft

    monkeypatch.setattr(peft, "read_adapter", lambda *args, **kwargs: None)  # not the folder's reading
    processor = Processor(llm.llm_engine.config)
    errors: list[str] = []
    per_thread = 1500

    def check(k: int) -> None:
        for j in range(per_thread):
            try:
                processor.check_lora(LoRARequest(f"a{k}-{j}", 1 + k * per_thread + j, f"/adapters/{k}-{j}"))
            except Exception as exc:  # noqa: BLE001 -- collected
                errors.append(repr(exc))

    threads = [threading.Thread(target=check, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    # Still one folder per id; once forgotten (the server unloaded it), the id is free.
    with pytest.raises(ValueError, match="has lora_int_id 1, which adapter 'a0-0'"):
        processor.check_lora(LoRARequest("other", 1, "/adapters/other"))
    processor.forget_lora(1)
    processor.check_lora(LoRARequest("other", 1, "/adapters/other"))


def test_load_inplace_reload_is_not_lost_with_its_request(llama, tmp_path):
    """A load_inplace request makes the workers read the adapter's folder again. When that
    request never runs (aborted while it waits for an adapter slot -- the server's
    load_inplace marks the name's next request, whose client may leave), the reload is
    still owed to the id: the next request with it gets the new weights (it got the
    cached old ones, under the new weights' prefix-cache salt)."""
    base, adapters = llama
    engine = LLM(str(base), enable_lora=True, max_loras=1, max_cpu_loras=3, max_lora_rank=16, max_model_len=128,
                 max_num_seqs=8)
    try:
        folder = shutil.copytree(adapters["all-r8"], tmp_path / "rl")
        old = engine.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("rl", 1, str(folder)),
                              use_tqdm=False)[0].outputs[0].token_ids
        new = engine.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("new", 2, str(adapters["qv-r16-rslora"])),
                              use_tqdm=False)[0].outputs[0].token_ids
        assert old != new
        shutil.rmtree(folder)
        shutil.copytree(adapters["qv-r16-rslora"], folder)  # the next checkpoint, in the same folder
        eng = engine.llm_engine
        # --max-loras 1: another adapter's request takes the slot, so the reloading one waits.
        eng.add_request("busy", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=4),
                        lora_request=LoRARequest("new", 2, str(adapters["qv-r16-rslora"])))
        eng.add_request("reload", PROMPTS[0], GREEDY, lora_request=LoRARequest("rl", 1, str(folder), load_inplace=True))
        eng.step()
        eng.abort_request(["reload"])
        while eng.has_unfinished_requests():
            eng.step()
        after = engine.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("rl", 1, str(folder)),
                                use_tqdm=False)[0].outputs[0].token_ids
        assert after == new
    finally:
        engine.shutdown()


def test_a_resolver_whose_resolve_lora_is_not_async_is_refused_by_name():
    """The server awaits resolve_lora: a plain def used to fail every unknown model's request
    with "object NoneType can't be used in 'await' expression"."""
    from forkless.lora import LoRAResolver, LoRAResolverRegistry

    class Plain(LoRAResolver):
        def resolve_lora(self, base_model_name, lora_name):  # not async
            return None

    class Fine(LoRAResolver):
        async def resolve_lora(self, base_model_name, lora_name):
            return None

    for target in (Plain, Plain()):
        with pytest.raises(TypeError, match=r"LoRA resolver 'plain':.*Plain.resolve_lora must be an async def"):
            LoRAResolverRegistry.register_resolver("plain", target)
    assert "plain" not in LoRAResolverRegistry.get_supported_resolvers()
    LoRAResolverRegistry.register_resolver("fine", Fine)
    try:
        assert isinstance(LoRAResolverRegistry.get_resolver("fine"), Fine)
    finally:
        LoRAResolverRegistry.unregister_resolver("fine")
