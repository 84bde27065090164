"""vLLM's LLM.collective_rpc (with worker_extension_cls), apply_model and sleep mode
(sleep / wake_up / is_sleeping), and the torch-profiler hooks, on a tiny model."""

from __future__ import annotations

from pathlib import Path

import json

import pytest

from forkless import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = ["Hello there", "The capital of France is"]
EXTENSION = "tests.engine.worker_extensions.ModelInfoExtension"


@pytest.fixture(scope="module")
def llm(tiny_llama: Path):
    engine = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24, enable_sleep_mode=True,
                 worker_extension_cls=EXTENSION)
    yield engine
    engine.shutdown()


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _num_kv_layers(worker) -> int:
    return -1 if worker.model_runner is None else len(worker.model_runner.kv_caches)


def test_collective_rpc_runs_a_worker_method_by_name_and_a_callable(llm: LLM) -> None:
    assert llm.collective_rpc("is_sleeping") == [False]
    layers = llm.collective_rpc(_num_kv_layers)
    assert layers == [2]  # the tiny model's two layers, one cache tensor each
    assert llm.collective_rpc(lambda w, a, b=0: (w.rank, a + b), args=(1,), kwargs={"b": 2}) == [(0, 3)]


def test_worker_extension_methods_run_by_name(llm: LLM) -> None:
    num_params = llm.collective_rpc("num_parameters")
    assert num_params[0] > 0
    assert llm.collective_rpc("rank_and", args=("x",)) == [{"rank": 0, "value": "x"}]
    # The worker's own methods are still there, and the base class is left unextended
    # for other engines of this process.
    assert llm.collective_rpc("is_sleeping") == [False]
    from forkless.worker.worker import Worker

    assert not hasattr(Worker, "num_parameters")


def test_apply_model_runs_a_function_on_the_model(llm: LLM) -> None:
    counts = llm.apply_model(lambda model: sum(p.numel() for p in model.parameters()))
    assert counts == llm.collective_rpc("num_parameters")
    assert llm.apply_model(lambda model: type(model).__name__) == ["LlamaForCausalLM"]
    with pytest.raises(TypeError, match="func must be callable"):
        llm.apply_model("model")


def test_worker_extension_that_redefines_a_worker_method_is_refused(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="defines check_health, which the worker class .*Worker has already"):
        LLM(str(tiny_llama), max_model_len=64, kv_cache_memory=1 << 22,
            worker_extension_cls="tests.engine.worker_extensions.ClashingExtension")
    with pytest.raises(ValueError, match="worker_extension_cls=3 is invalid"):
        LLM(str(tiny_llama), worker_extension_cls=3)


def test_collective_rpc_refuses_what_it_cannot_honour(llm: LLM) -> None:
    with pytest.raises(AttributeError, match="no public method 'nope'.*check_health"):
        llm.collective_rpc("nope")
    with pytest.raises(AttributeError, match="no public method '_runner'"):
        llm.collective_rpc("_runner")
    with pytest.raises(ValueError, match="timeout=5.*uni executor"):
        llm.collective_rpc("check_health", timeout=5)
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        llm.collective_rpc("check_health", args="x")


def test_sleep_frees_the_kv_cache_and_wake_up_gives_the_same_greedy_tokens(llm: LLM) -> None:
    before = _tokens(llm)
    llm.sleep(level=1)
    try:
        assert llm.is_sleeping()
        assert llm.collective_rpc(_num_kv_layers) == [0]  # freed, not just flagged
        with pytest.raises(RuntimeError, match="sleeps.*wake_up"):
            llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        with pytest.raises(RuntimeError, match="sleeps already"):
            llm.sleep()
    finally:
        llm.wake_up()
    assert not llm.is_sleeping()
    assert llm.collective_rpc(_num_kv_layers) == [2]
    assert _tokens(llm) == before
    assert not llm.llm_engine.has_unfinished_requests()  # the refused requests left nothing behind


def test_level_two_frees_the_weights_and_wakes_by_tags(llm: LLM) -> None:
    before = _tokens(llm)
    llm.sleep(level=2)
    try:
        assert llm.collective_rpc(_num_kv_layers) == [-1]  # no model runner: no weights
        with pytest.raises(RuntimeError, match="wake 'weights' first"):
            llm.wake_up(["kv_cache"])
        with pytest.raises(ValueError, match=r"\['gpu'\] are invalid"):
            llm.wake_up(["gpu"])
        llm.wake_up(["weights"])
        assert llm.is_sleeping() and llm.collective_rpc(_num_kv_layers) == [0]
    finally:
        llm.wake_up(["kv_cache"])
    assert not llm.is_sleeping()
    assert _tokens(llm) == before
    with pytest.raises(RuntimeError, match="not sleeping"):
        llm.wake_up()


def test_sleep_level_is_checked(llm: LLM) -> None:
    with pytest.raises(ValueError, match="level=3 is invalid"):
        llm.sleep(level=3)
    with pytest.raises(ValueError, match="only a server's engine"):  # (a pause nobody could end)
        llm.sleep(level=0)
    assert not llm.is_sleeping()


def test_sleep_needs_enable_sleep_mode(tiny_llama: Path) -> None:
    plain = LLM(str(tiny_llama), max_model_len=64, kv_cache_memory=1 << 22)
    try:
        with pytest.raises(ValueError, match="enable_sleep_mode=True"):
            plain.sleep()
        assert not plain.is_sleeping()
    finally:
        plain.shutdown()
    with pytest.raises(ValueError, match="enable_sleep_mode='yes' is invalid"):
        LLM(str(tiny_llama), enable_sleep_mode="yes")


@pytest.mark.parametrize("method", ["start_profile", "stop_profile"])
def test_the_profiler_needs_a_profiler_config(llm: LLM, method: str) -> None:
    with pytest.raises(RuntimeError, match=f"LLM.{method}.*profiler_config"):
        getattr(llm, method)()


@pytest.mark.parametrize(("config", "message"), [
    ({"profiler": "cuda", "torch_profiler_dir": "t"}, "profiler='cuda' is not supported"),
    ({"profiler": "torch"}, "torch_profiler_dir=None is invalid"),
    ({"torch_profiler_dir": "t", "torch_profiler_use_gzip": True}, r"\['torch_profiler_use_gzip'\] are not supported"),
    ({"torch_profiler_dir": "t", "torch_profiler_with_stack": "yes"}, "torch_profiler_with_stack='yes' is invalid"),
])
def test_a_bad_profiler_config_is_refused(tiny_llama: Path, config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama), profiler_config=config)


def test_collective_rpc_in_worker_processes(tiny_llama: Path, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    mp = LLM(str(tiny_llama), max_model_len=64, kv_cache_memory=1 << 22, distributed_executor_backend="mp",
             worker_cls="tests.engine.mp_workers.RpcWorker", enable_sleep_mode=True,
             worker_extension_cls=EXTENSION,
             profiler_config={"profiler": "torch", "torch_profiler_dir": str(traces),
                              "torch_profiler_record_shapes": True})
    try:
        # The worker process profiles a generation and writes its trace at the stop.
        mp.start_profile()
        with pytest.raises(RuntimeError, match="the profiler runs already"):
            mp.start_profile()
        mp.generate(PROMPTS, GREEDY, use_tqdm=False)
        mp.stop_profile()
        with pytest.raises(RuntimeError, match="the profiler does not run"):
            mp.stop_profile()
        (trace,) = traces.glob("rank0*.pt.trace.json")
        names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
        assert any(name.startswith("aten::") for name in names)
        assert mp.collective_rpc("echo", args=([1, "a"],), kwargs={"scale": 2}) == [{"rank": 0,
                                                                                     "value": [1, "a", 1, "a"]}]
        # The extension's methods, mixed into RpcWorker in the worker process.
        assert mp.collective_rpc("rank_and", args=([2],)) == [{"rank": 0, "value": [2]}]
        assert mp.collective_rpc("num_parameters")[0] > 0
        with pytest.raises(TypeError, match="apply_model: the workers run in other processes.*'mp'"):
            mp.apply_model(lambda model: 1)
        with pytest.raises(TypeError, match="name of a worker method, got a callable"):
            mp.collective_rpc(lambda w: 1)
        with pytest.raises(RuntimeError, match="'device_handle'.*cannot cross"):
            mp.collective_rpc("device_handle")
        with pytest.raises(TimeoutError, match="did not answer within 0.2 s"):
            mp.collective_rpc("pause", timeout=0.2, args=(1.0,))
        # The late answer is dropped: the next call gets its own.
        assert mp.collective_rpc("echo", args=(3,)) == [{"rank": 0, "value": 3}]
        before = [list(o.outputs[0].token_ids) for o in mp.generate(PROMPTS, GREEDY, use_tqdm=False)]
        mp.sleep()
        mp.wake_up()
        assert [list(o.outputs[0].token_ids) for o in mp.generate(PROMPTS, GREEDY, use_tqdm=False)] == before
    finally:
        mp.shutdown()
