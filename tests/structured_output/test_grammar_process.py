"""The grammars in a process of their own (``FORKLESS_GRAMMAR_PROCESS=1``, the default with the ``mp``
executor): the outputs of
the engine core's own grammar threads, with synchronous and async steps, in-process and
worker-process executors; a constraint that does not compile fails its request only; the
process leaves with the engine, also when the engine's process is killed."""

from __future__ import annotations

import json
import gc
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from forkless import LLM, SamplingParams, StructuredOutputsParams
from forkless.structured_output.backend_xgrammar import XgrammarBackend
from forkless.structured_output.process import GrammarProcessClient
from tests.structured_output.schemas import CHOICES, PROMPTS, SCHEMAS
from tests.structured_output.test_engine_core import check_a_failed_compile_fails_its_request_only

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


class SlowFillBackend(XgrammarBackend):
    """xgrammar, whose fills take 0-40 ms longer (in each grammar process alike)."""

    def fill_bitmasks(self, grammars, bitmask, indices):
        time.sleep(random.uniform(0, 0.04))
        return super().fill_bitmasks(grammars, bitmask, indices)


@pytest.fixture(autouse=True)
def one_grammar_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process unless a test asks for more: the default follows the host's cores."""
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESSES", "1")


def _cases(llm: LLM) -> tuple[list[str], list[SamplingParams]]:
    tokenizer = llm.get_tokenizer()

    def chat(question: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)

    prompts = [chat(PROMPTS["person"]), chat(PROMPTS["array"]), chat(PROMPTS["person"]), chat("Capital of France?"),
               chat("Is the sky blue?"), "The capital of France is"]
    params = [SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=SCHEMAS[n]))
              for n in ("person", "array")]
    params.append(SamplingParams(temperature=0.8, seed=3, max_tokens=80,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMAS["person"])))
    params.append(SamplingParams(temperature=0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=CHOICES)))
    params.append(SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no", "maybe so"])))
    params.append(SamplingParams(temperature=0, max_tokens=24))
    # The seeded request keeps steps synchronous while it runs (its sampling reads its
    # output length): a constrained request that outlives it (80 tokens of "yes"/"no")
    # makes sure async runs have constrained steps left to defer, whatever lengths the
    # others' answers have.
    prompts.append(chat("Say yes or no, many times."))
    params.append(SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(
        regex="(yes|no)( (yes|no)){60}")))
    return prompts, params


def _seen(outputs: list) -> list[tuple]:
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]


@pytest.fixture(scope="module")
def reference(smollm2_folder: Path) -> list[tuple]:
    """The outputs with the grammars on the engine core's threads (synchronous steps)."""
    llm = LLM(str(smollm2_folder), max_model_len=512, max_num_seqs=16)
    try:
        assert not isinstance(llm.llm_engine.engine_core._structured, GrammarProcessClient)
        return _seen(llm.generate(*_cases(llm), use_tqdm=False))
    finally:
        llm.shutdown()


@pytest.mark.parametrize(("engine_kwargs", "processes", "route_tokens"), [
    ({}, 1, True),
    ({"async_scheduling": True}, 1, True),
    ({"async_scheduling": True, "distributed_executor_backend": "mp"}, 1, True),
    ({"async_scheduling": True, "distributed_executor_backend": "mp"}, 1, False),
    ({}, 3, True),
    ({"async_scheduling": True, "distributed_executor_backend": "mp",
      "structured_outputs_config": {"backend": f"{__name__}:SlowFillBackend"}}, 3, True),
], ids=["sync", "async", "async-mp", "async-mp-tokens-through-the-core", "sync-3-processes", "async-mp-3-processes"])
def test_the_grammar_process_gives_the_engine_cores_outputs(smollm2_folder: Path, reference: list[tuple],
                                                            engine_kwargs: dict, processes: int, route_tokens: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``FORKLESS_GRAMMAR_PROCESSES=3`` the requests are shared out over three
    processes, each filling its own rows; the worker samples once all three wrote theirs
    (their fills take random times here: a worker that sampled at the first would read
    the others' rows as the step before left them). With ``mp`` the worker sends the
    deferred steps' tokens to the processes itself, unless
    ``FORKLESS_GRAMMAR_ROUTE_TOKENS=0``."""
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", "1")
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESSES", str(processes))
    monkeypatch.setenv("FORKLESS_GRAMMAR_ROUTE_TOKENS", "1" if route_tokens else "0")
    llm = LLM(str(smollm2_folder), max_model_len=512, max_num_seqs=16, **engine_kwargs)
    try:
        client = llm.llm_engine.engine_core._structured
        assert isinstance(client, GrammarProcessClient)
        sent: list[bytes] = []
        fills: list[list] = []
        by_process: set[int] = set()
        send = client._send
        client._send = lambda kind, payload, index=0: (sent.append(kind), by_process.add(index),
                                                       kind == b"fill" and fills.append(payload),
                                                       send(kind, payload, index))[-1]
        # Who tells the workers to sample a deferred step: the process, where the executor
        # gives it a route to them (mp), else the engine core.
        executor = llm.llm_engine.engine_core.executor
        routes: list = []
        route = client._sample_route
        client._sample_route = lambda pending: (routes.append(route(pending)), routes[-1])[1]
        by_core: list = []
        if executor.supports_deferred_sampling:
            sample = executor.sample_deferred
            executor.sample_deferred = lambda pending, bitmask: (by_core.append(pending), sample(pending, bitmask))[1]
        got = _seen(llm.generate(*_cases(llm), use_tqdm=False))
        procs, ipc_dir = list(client._procs), client._ipc_dir
        assert len(procs) == processes and all(p.poll() is None for p in procs) and os.path.isdir(ipc_dir)
    finally:
        llm.shutdown()
    assert got == reference
    # A deferred fill goes to every process (each sends its part of the sample message).
    assert by_process == set(range(processes)) if engine_kwargs else by_process <= set(range(processes))
    jsonschema.validate(json.loads(got[0][1]), SCHEMAS["person"])
    jsonschema.validate(json.loads(got[2][1]), SCHEMAS["person"])
    # Async steps had their bitmask filled by the process while the forward ran; the
    # first step of a request, and synchronous steps, got theirs at the plan.
    assert b"fill_now" in sent
    assert (b"fill" in sent) == bool(engine_kwargs)
    if not engine_kwargs:
        assert not routes and not by_core
    elif engine_kwargs.get("distributed_executor_backend") == "mp":
        assert routes and not by_core
        for seq, addresses in routes:  # (Executor.deferred_sample_route: one socket per worker)
            assert isinstance(seq, int) and len(addresses) == 1 and addresses[0].startswith("ipc://")
        # The deferred steps' tokens went from the worker to the processes (a fill names
        # the routed step whose tokens to take), or else through the engine core (the
        # early accept's fill carries them; so it does for a step planned synchronously,
        # a request's first, whose plan names no route).
        tokens_from_worker = [f for f in fills if f[9] is not None]
        tokens_from_core = [f for f in fills if f[0] is not None]
        assert (client._next_fill_id > 0) == route_tokens
        assert bool(tokens_from_worker) == route_tokens and (route_tokens or tokens_from_core)
    else:
        # (The last step launched may stay uncollected once every request is done: it is
        # sampled, and dropped, at the next step.)
        assert routes and all(r is None for r in routes) and len(routes) - 1 <= len(by_core) <= len(routes)
    # The processes left with the engine, and took their socket directory along.
    assert all(p.wait(10) == 0 for p in procs)
    assert not os.path.exists(ipc_dir)


def test_guidance_through_the_process_with_async_steps(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """guidance cannot tell completion from the tokens, so the process advances its
    grammars when asked and answers (it once left the step loop waiting for an answer that
    never came): async ``mp`` through the process gives the engine core's own outputs."""
    constraints = [StructuredOutputsParams(choice=["yes", "no", "maybe so"]), StructuredOutputsParams(regex="[a-z]{3,9}"),
                   StructuredOutputsParams(json=SCHEMAS["person"]), None]
    params = [SamplingParams(temperature=0, max_tokens=24, structured_outputs=c) for c in constraints]
    prompts = ["Is the sky blue?", "A word:", "A person:", "Hello"]
    seen = []
    for setting, kwargs in (("0", {}), ("1", {"async_scheduling": True, "distributed_executor_backend": "mp"})):
        monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", setting)
        llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24,
                  structured_outputs_config={"backend": "guidance"}, **kwargs)
        try:
            assert isinstance(llm.llm_engine.engine_core._structured, GrammarProcessClient) is (setting == "1")
            seen.append(_seen(llm.generate(prompts, params, use_tqdm=False)))
        finally:
            llm.shutdown()
    assert seen[1] == seen[0]
    assert seen[0][0][1] in ("yes", "no", "maybe so") and seen[0][0][2] == "stop"


def test_a_constraint_that_does_not_compile_fails_its_request_only(tiny_llama: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend, given by class path, is resolved in the grammar process too."""
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", "1")
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24,
              structured_outputs_config={"backend": "tests.structured_output.test_engine_core:GatedBackend"})
    try:
        assert isinstance(llm.llm_engine.engine_core._structured, GrammarProcessClient)
        check_a_failed_compile_fails_its_request_only(llm)
    finally:
        llm.shutdown()


_KILLED = """
import os, sys
from forkless import LLM, SamplingParams, StructuredOutputsParams
llm = LLM(sys.argv[1], max_model_len=256, kv_cache_memory=1 << 24)
out = llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
                   use_tqdm=False)
print(llm.llm_engine.engine_core._structured._procs[0].pid, out[0].outputs[0].text, flush=True)
os._exit(9)  # no shutdown: as if killed
"""


def test_the_grammar_process_exits_when_the_engine_is_killed(tiny_llama: Path) -> None:
    env = dict(os.environ, FORKLESS_GRAMMAR_PROCESS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _KILLED, str(tiny_llama)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 9, out.stderr[-3000:]
    pid, text = out.stdout.split()
    assert text in ("yes", "no")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # exited; its new parent has not reaped it yet
            return
        time.sleep(0.2)
    os.kill(int(pid), 9)
    pytest.fail(f"the grammar process {pid} outlived the engine by 15 s")


def test_a_dropped_engine_stops_its_grammar_process(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine dropped without a shutdown (a script that forgets ``llm.shutdown()``)
    stops its grammar process when it is collected, not when the script exits."""
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", "1")
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24)
    out = llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"])), use_tqdm=False)
    assert out[0].outputs[0].text in ("yes", "no")
    client = llm.llm_engine.engine_core._structured
    assert isinstance(client, GrammarProcessClient)
    (proc,), ipc_dir = client._procs, client._ipc_dir
    assert proc.poll() is None
    del llm, client, out
    gc.collect()
    assert proc.wait(10) == 0  # told to stop, and it did
    assert not os.path.exists(ipc_dir)


def test_the_process_is_the_default_with_the_mp_executor_only(tiny_llama: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, ``FORKLESS_GRAMMAR_PROCESS`` means the process with ``mp`` (the server's
    executor, where it measured ahead) and the engine core's threads with ``uni``; ``0``
    keeps the grammars in the engine core with ``mp`` too."""
    monkeypatch.delenv("FORKLESS_GRAMMAR_PROCESS", raising=False)
    for backend, setting, expected in (("mp", None, True), ("uni", None, False), ("mp", "0", False)):
        if setting is not None:
            monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", setting)
        llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24, distributed_executor_backend=backend)
        try:
            assert isinstance(llm.llm_engine.engine_core._structured, GrammarProcessClient) is expected, backend
        finally:
            llm.shutdown()


class FillFailsBackend(XgrammarBackend):
    """xgrammar, whose fills fail after the first two (in the grammar process)."""

    fills = 0

    def fill_bitmasks(self, grammars, bitmask, indices):
        FillFailsBackend.fills += 1
        if FillFailsBackend.fills > 2:
            raise RuntimeError("this backend's fill broke")
        return super().fill_bitmasks(grammars, bitmask, indices)


def test_a_failing_fill_fails_the_engine_and_leaves_no_worker_waiting(tiny_llama: Path) -> None:
    """With ``mp``, the process tells the workers to sample a deferred step itself: when
    its fill fails, the engine raises the backend's error, and the workers shut down at
    once (none is left waiting for a sample message)."""
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24, async_scheduling=True,
              distributed_executor_backend="mp",
              structured_outputs_config={"backend": f"{__name__}:FillFailsBackend"})
    procs = list(llm.llm_engine.engine_core.executor.procs)
    try:
        with pytest.raises(RuntimeError, match="this backend's fill broke"):
            llm.generate(["x"], SamplingParams(max_tokens=24, structured_outputs=StructuredOutputsParams(
                regex="[a-z]{30}")), use_tqdm=False)
    finally:
        started = time.monotonic()
        llm.shutdown()
    assert time.monotonic() - started < 8  # (a worker that had to be killed takes 10 s)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


def test_a_killed_grammar_process_fails_the_engine_without_a_hang(tiny_llama: Path) -> None:
    """The grammar process gone mid-run (killed): the next step raises an error that says
    so, and shutting the engine down does not wait on a worker left expecting a sample."""
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24, async_scheduling=True,
              distributed_executor_backend="mp")
    engine = llm.llm_engine
    procs = list(engine.engine_core.executor.procs)
    try:
        for i in range(4):
            engine.add_request(f"r{i}", "x", SamplingParams(max_tokens=60, ignore_eos=True,
                                                             structured_outputs=StructuredOutputsParams(
                                                                 regex="[a-z ]{80}")))
        for _ in range(6):
            engine.step()
        client = engine.engine_core._structured
        assert isinstance(client, GrammarProcessClient) and client._procs[0].poll() is None
        client._procs[0].kill()
        client._procs[0].wait(10)
        with pytest.raises(RuntimeError, match="grammar process died"):
            for _ in range(60):
                engine.step()
    finally:
        started = time.monotonic()
        llm.shutdown()
    assert time.monotonic() - started < 8  # (a worker that had to be killed takes 10 s)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


def test_routed_tokens_of_preempted_requests_are_dropped(smollm2_folder: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A request preempted while its token is in flight gets that token dropped by the
    scheduler: the grammar process, which has it from the worker, must not advance the
    grammar over it (it would then be a token ahead of the output when the request
    resumes, and mask for the wrong place). A KV cache of a few blocks preempts often."""
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESSES", "2")
    llm = LLM(str(smollm2_folder), max_model_len=160, max_num_seqs=8, async_scheduling=True,
              distributed_executor_backend="mp", kv_cache_memory=14 << 20)
    try:
        core = llm.llm_engine.engine_core
        client = core._structured
        assert isinstance(client, GrammarProcessClient)
        voids: list[list[str]] = []
        take = client.take_routed_tokens
        client.take_routed_tokens = lambda step, fill, void: (voids.append(list(void)), take(step, fill, void))[1]
        tokenizer = llm.get_tokenizer()
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"{PROMPTS['person']} (#{i})"}],
                                                 tokenize=False, add_generation_prompt=True) for i in range(8)]
        params = SamplingParams(temperature=0, max_tokens=100,
                                structured_outputs=StructuredOutputsParams(json=SCHEMAS["person"]))
        outs = llm.generate(prompts, params, use_tqdm=False)
        preemptions = core.scheduler.num_preemptions
    finally:
        llm.shutdown()
    assert preemptions > 0 and any(voids)
    for out in outs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SCHEMAS["person"])
