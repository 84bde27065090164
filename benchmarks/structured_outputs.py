"""Structured outputs: a batch of JSON-schema requests against the same batch unconstrained.

Both batches have the same prompts and produce exactly ``--max-tokens`` tokens per
request: the schema asks for a long array of integers (more items than the budget has
tokens), so every constrained request runs to ``max_tokens``; the unconstrained batch
uses ``ignore_eos``. The constrained batch runs once before measuring, so its grammar is
compiled (the issue's "once compiled"); then baseline and constrained alternate
``--repeats`` times on one engine and the best time of each is kept. Also measured, on a
fresh backend of the same tokenizer: the time to compile a typical schema and to get it
again from the cache.

    python benchmarks/structured_outputs.py                  # default model, this machine's CPU
    python benchmarks/structured_outputs.py --backend guidance --batch 32 --max-tokens 64
    python benchmarks/structured_outputs.py --model PATH     # another model folder
    # On a GPU: the Qwen3-0.6B shape with dummy weights (and the default model's tokenizer,
    # whose tokens a JSON grammar can use; the model's wider vocabulary is masked past it):
    python benchmarks/structured_outputs.py --shape qwen3-0.6b --batch 256 --dtype bfloat16 [--async-scheduling]
    # ... with the worker in its own process, as `forkless serve` runs it:
    python benchmarks/structured_outputs.py ... --async-scheduling --distributed-executor-backend mp

The issue's bars: constrained >= 0.9x the unconstrained throughput at batch 32 on CPU; on
the H200 (Qwen3-0.6B shape, dummy weights) the bitmask's overhead per step <= 5 % at batch
256 (``--step-median``'s line: the decode steps alone; the whole batch's ``overhead``,
1 / ratio - 1, also counts each request's admission: its constraint's check and its
grammar's compile or cache hit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# A long array of small integers: the output never completes within the token budget.
LONG_ARRAY = {
    "type": "object",
    "properties": {"readings": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
                                "minItems": 500}},
    "required": ["readings"],
    "additionalProperties": False,
}
# --check: a JSON object through a regex of bounded length (a JSON schema admits unbounded
# whitespace, which random weights can pick forever), validated against its schema.
CHECK_REGEX = r'\{"id": [1-9][0-9]{0,2}, "tag": "(red|green|blue)"\}'
CHECK_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                                 "tag": {"enum": ["red", "green", "blue"]}},
                "required": ["id", "tag"], "additionalProperties": False}
# What a typical API request sends (for the compile-time measurement).
TYPICAL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
}


def compile_times(model: str, backend: str, batch: int) -> tuple[float, float, tuple[float, float]]:
    """(first compile, cache hit) of TYPICAL, in seconds, on a fresh backend, and the
    bitmask's cost per step at ``batch`` (:func:`step_costs`)."""
    from forkless.model_loader.default_model import resolve_model_path
    from forkless.structured_output import StructuredOutputBackendRegistry, StructuredOutputsConfig
    from forkless.tokenizers.loading import load_tokenizer

    folder = str(resolve_model_path(model))
    config = json.loads(open(f"{folder}/config.json").read())
    tokenizer = load_tokenizer(folder)
    cls = StructuredOutputBackendRegistry.resolve(backend)
    instance = cls(tokenizer, int(config["vocab_size"]), [tokenizer.eos_token_id], StructuredOutputsConfig())
    spec = json.dumps(TYPICAL, sort_keys=True)
    started = time.perf_counter()
    instance.compile_grammar("json", spec)
    first = time.perf_counter() - started
    started = time.perf_counter()
    instance.compile_grammar("json", spec)
    return first, time.perf_counter() - started, step_costs(instance, batch)


def step_costs(backend, batch: int, repeats: int = 20) -> tuple[float, float]:
    """(engine core's fill of ``batch`` rows, worker's apply to ``[batch, vocab]`` float32
    logits on the CPU), seconds per step: the bitmask's whole cost, apart from the
    transfer of its bytes."""
    import torch

    from forkless.structured_output.bitmask import apply_token_bitmask

    grammars = [backend.compile_grammar("json", json.dumps(LONG_ARRAY, sort_keys=True)) for _ in range(batch)]
    bitmask = backend.allocate_token_bitmask(batch)
    logits = torch.randn(batch, backend.vocab_size)
    started = time.perf_counter()
    for _ in range(repeats):
        backend.fill_bitmasks(grammars, bitmask, list(range(batch)))
        packed = bitmask.tobytes()
    fill = (time.perf_counter() - started) / repeats
    import numpy as np

    rows = np.frombuffer(packed, dtype=np.int32).reshape(batch, -1)
    started = time.perf_counter()
    for _ in range(repeats):
        apply_token_bitmask(logits, rows, list(range(batch)))
    return fill, (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument("--backend", default="xgrammar")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", default=None, help="a forkless.bench.shapes shape with dummy weights "
                        "and the default model's tokenizer, instead of --model")
    parser.add_argument("--tokenizer-from", default=None,
                        help="with --shape: the folder whose tokenizer to use (default: the default model's)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="with --shape: the model's vocabulary (default: the shape's; the tokenizer's own size "
                             "avoids xgrammar's cost for ids past it, ~10x per accepted token)")
    parser.add_argument("--steady", action="store_true",
                        help="also run twice the tokens and print the steady decode step's time (the extra "
                             "steps' time divided by their number: no admission, set-up or prefill)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="both batches with async steps (the grammars then overlap the forward)")
    parser.add_argument("--step-median", type=int, default=0, metavar="R",
                        help="also R alternations of both batches stepped one engine step at a time: the median "
                             "time between steps once the batch runs (steps 16 to the fourth-last), robust to the "
                             "bursts of host noise that the --steady difference of two minimums is not")
    parser.add_argument("--distributed-executor-backend", choices=("uni", "mp"), default=None,
                        help="the executor (vLLM's flag): mp runs the worker in its own process, as the "
                             "server does (default: the engine's, uni for the offline LLM)")
    parser.add_argument("--no-detokenize", action="store_true",
                        help="both batches ask for token ids only (as `forkless bench throughput` does): their "
                             "texts differ, and detokenizing them is no cost of the bitmask")
    parser.add_argument("--check", action="store_true",
                        help="first decode the batch under a JSON-shaped regex that always completes and check "
                             "every output (valid JSON of CHECK_SCHEMA, finish 'stop'); prints a digest of the "
                             "token ids, to compare settings (e.g. FORKLESS_GRAMMAR_PROCESSES) run to run")
    args = parser.parse_args()

    from forkless import LLM, SamplingParams, StructuredOutputsParams

    engine_args: dict = {"dtype": args.dtype, "async_scheduling": args.async_scheduling}
    if args.distributed_executor_backend is not None:
        engine_args["distributed_executor_backend"] = args.distributed_executor_backend
    if args.shape is not None:
        args.model = shaped_model(args.shape, args.tokenizer_from, args.vocab_size)
        engine_args["load_format"] = "dummy"

    first, hit, (fill, apply) = compile_times(args.model, args.backend, args.batch)
    print(f"compile a typical schema ({args.backend}): {first * 1e3:.1f} ms; cache hit: {hit * 1e3:.2f} ms")
    print(f"bitmask per step at batch {args.batch}: fill {fill * 1e3:.2f} ms (engine core), "
          f"apply {apply * 1e3:.2f} ms (worker, CPU)")

    llm = LLM(args.model, max_num_seqs=max(args.batch, 8), structured_outputs_config={"backend": args.backend},
              **engine_args)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Sensor {i}: list its readings as JSON."}], tokenize=False,
        add_generation_prompt=True) for i in range(args.batch)]
    detokenize = not args.no_detokenize
    plain = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=detokenize)
    constrained = SamplingParams(temperature=0, max_tokens=args.max_tokens, detokenize=detokenize,
                                 structured_outputs=StructuredOutputsParams(json=LONG_ARRAY))

    def seconds(params: SamplingParams) -> float:
        started = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        assert tokens == args.batch * params.max_tokens, tokens  # the same work in both batches
        return elapsed

    def longer(params: SamplingParams) -> SamplingParams:
        doubled = params.clone()
        doubled.max_tokens = 2 * args.max_tokens
        return doubled

    if args.check:
        check_outputs(llm, prompts)
    seconds(constrained)  # compile and warm up
    seconds(plain)
    base, cons, base2, cons2 = [], [], [], []
    for _ in range(args.repeats):
        base.append(seconds(plain))
        cons.append(seconds(constrained))
        if args.steady:
            base2.append(seconds(longer(plain)))
            cons2.append(seconds(longer(constrained)))
    medians: list[tuple[float, float]] = []
    for r in range(args.step_median):
        medians.append((median_step(llm, prompts, longer(plain), f"u{r}"),
                        median_step(llm, prompts, longer(constrained), f"c{r}")))
    llm.shutdown()
    tokens = args.batch * args.max_tokens
    b, c = tokens / min(base), tokens / min(cons)
    print(f"batch {args.batch} x {args.max_tokens} tokens: unconstrained {b:.1f} tok/s, JSON schema {c:.1f} tok/s, "
          f"ratio {c / b:.2f}x, whole-batch overhead {100 * (b / c - 1):.1f} % "
          f"(per run: {', '.join(f'{x / y:.2f}' for x, y in zip(base, cons))})")
    if args.steady:
        # The extra max_tokens decode steps of the longer runs, without admission,
        # grammar set-up and prefill (which the whole-batch figure above includes).
        step_b = (min(base2) - min(base)) / args.max_tokens
        step_c = (min(cons2) - min(cons)) / args.max_tokens
        print(f"steady decode step of {args.batch}: unconstrained {step_b * 1e3:.2f} ms, JSON schema "
              f"{step_c * 1e3:.2f} ms, overhead {100 * (step_c / step_b - 1):.1f} %")
    if medians:
        overheads = [c / u - 1 for u, c in medians]
        print(f"median decode step of {args.batch} ({2 * args.max_tokens} tokens, one engine step at a time), "
              f"per alternation: " + ", ".join(f"{u * 1e3:.2f} / {c * 1e3:.2f} ms ({100 * o:+.1f} %)"
                                              for (u, c), o in zip(medians, overheads))
              + f"; overhead, median of the alternations: {100 * statistics.median(overheads):+.1f} %")


def check_outputs(llm, prompts: list[str]) -> None:
    """Decode ``prompts`` greedily under CHECK_REGEX (its outputs always end within 32
    tokens, whatever the weights) and fail unless each is valid JSON of CHECK_SCHEMA
    that finished with ``stop``; print how many, and a digest of all token ids."""
    import hashlib

    import jsonschema

    from forkless import SamplingParams, StructuredOutputsParams

    params = SamplingParams(temperature=0, max_tokens=64, structured_outputs=StructuredOutputsParams(regex=CHECK_REGEX))
    outs = llm.generate(prompts, params, use_tqdm=False)
    digest = hashlib.sha256()
    for out in outs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (out.request_id, completion.finish_reason, completion.text)
        jsonschema.validate(json.loads(completion.text), CHECK_SCHEMA)
        digest.update(repr(list(completion.token_ids)).encode())
    print(f"check: {len(outs)} outputs, each valid JSON of the schema, finished 'stop'; token ids digest "
          f"{digest.hexdigest()[:16]}")


def median_step(llm, prompts: list[str], params, tag: str) -> float:
    """Median seconds between engine steps while the whole batch decodes: the requests are
    queued at once and stepped to the end one ``LLMEngine.step()`` at a time; the first 16
    intervals (admission, prefill) and the last 4 (the batch draining) are left out. The
    outputs are asked for as ``LLM.generate`` asks (final only): a cumulative output per
    row and step, which the server's engine core never builds, cost ~1 ms a step at batch
    256 on the H100 host and diluted the ratio."""
    import msgspec

    from forkless.sampling_params import RequestOutputKind

    params = msgspec.structs.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    times = [time.perf_counter()]
    while engine.has_unfinished_requests():
        engine.step()
        times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(times, times[1:])][16:-4]
    return statistics.median(gaps)


def shaped_model(shape: str, tokenizer_from: str | None, vocab_size: int | None = None) -> str:
    """A folder of ``shape`` (no weights: load it with dummy weights) holding the
    tokenizer files of ``tokenizer_from`` (default: the default model's folder)."""
    import shutil
    import tempfile
    from pathlib import Path

    from forkless.bench.shapes import write_model_folder
    from forkless.model_loader.default_model import default_model_path

    out = write_model_folder(Path(tempfile.mkdtemp()) / shape, shape)
    source = Path(tokenizer_from or default_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    config = json.loads((out / "config.json").read_text())
    eos = json.loads((source / "config.json").read_text()).get("eos_token_id")
    config["eos_token_id"] = eos
    if vocab_size is not None:
        config["vocab_size"] = vocab_size
    (out / "config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return str(out)


if __name__ == "__main__":
    main()
