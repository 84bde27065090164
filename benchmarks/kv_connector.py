"""KV connectors: TTFT of a prompt whose KV is in the store against recomputing it, and
what saving every request's KV costs in throughput, in one run.

**TTFT (served, as a user sees it).** For each connector (``SharedStorageConnector`` on a
fresh folder, ``RedisConnector`` on a ``redis-server`` this script starts on a free
loopback port) two ``forkless serve`` processes share the store: a producer
(``kv_role`` ``kv_producer``) and a consumer (``kv_consumer``); a fifth server has no
connector (the baseline). All are started before the first timed request. Then, for each
of ``--prompts`` prompts P_i of ``--prefix-tokens`` random token ids, one request at a
time: the baseline gets P_i + ``--new-tokens`` new tokens (recomputed); each producer gets
P_i (it computes it and saves its KV); once the store holds every block of P_i (an
asynchronous save may still be writing after the first token; the wait is printed), the
consumer, which has never seen P_i (its own prefix cache is empty for it), gets P_i + the
same new tokens and loads the stored blocks, computing only the rest. The prompts
alternate between the servers, so on a shared machine a slow spell lands on every side.
Every server is warmed up first with a short request (on the consumer, one whose KV is
stored, so the load path is warm too). TTFT is the time from sending a streaming
completion (``max_tokens=1``, greedy, the official ``openai`` client, prompt as token
ids) to its first chunk. Prints each TTFT, the medians and the ratio baseline / loaded,
and the consumers' ``/metrics`` (tokens found in the store, KV bytes and seconds loaded),
so a ratio near 1 from blocks that were never found shows as such.

**Throughput cost of saving (offline).** ``--num-requests`` requests with distinct
prompts of ``--prompt-len`` random tokens and ``--output-len`` output tokens
(``ignore_eos``), through one ``LLM.generate`` call on a fresh ``LLM``: without a
connector, and with each connector as ``kv_producer`` (a fresh folder / an emptied Redis
every run, so every block is written), interleaved, best of ``--repeats`` each. Prints
output tokens per second and the ratio connector / none.

    python benchmarks/kv_connector.py                  # default model (SmolLM2-135M) on this CPU
    python benchmarks/kv_connector.py --skip-throughput --prompts 3 --connectors shared
    # the H200 shape: Qwen3-0.6B, dummy weights, bf16, 8k-token prefixes (five servers share
    # the GPU: each gets --kv-cache-gib; --connectors shared where redis-server is missing)
    python benchmarks/kv_connector.py --shape qwen3-0.6b --load-format dummy --dtype bfloat16 \\
        --prefix-tokens 8192 --kv-cache-gib 4 --prompt-len 2000 --num-requests 256
    # the same code path on CPU with a small shape
    python benchmarks/kv_connector.py --shape qwen3-0.6b --shape-layers 2 --load-format dummy \\
        --prefix-tokens 512 --prompts 2 --num-requests 8 --prompt-len 128 --output-len 16 --repeats 1

``--shape`` writes a model folder of a known shape (``forkless.bench.shapes``, no weights:
pair it with ``--load-format dummy``). Dummy weights differ between processes, so the
loaded KV is not the one the consumer would have computed: fine for timing, which is all
this measures (the tests check outputs). The issue's bars (default model, CPU): TTFT
>= 5x lower through ``SharedStorageConnector``, >= 3x through Redis; saving costs
<= 10 % of throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from forkless.bench.serve import free_port, start_server, stop_server

CONNECTORS = {"shared": "SharedStorageConnector", "redis": "RedisConnector"}
METRICS = ("forkless:external_prefix_cache_queries", "forkless:external_prefix_cache_hits",
           "forkless:kv_transfer_load_bytes", "forkless:kv_transfer_load_seconds",
           "forkless:kv_transfer_save_bytes", "forkless:kv_transfer_save_seconds")


# ------------------------------------------------------------------ stores

class Redis:
    """A ``redis-server`` on a free loopback port, no persistence, for this run only."""

    def __init__(self, binary: str, log: Path) -> None:
        import redis

        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._log = open(log, "wb")
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--protected-mode", "yes"],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start; see {log}") from None
                time.sleep(0.05)

    def flush(self) -> None:
        self.client.flushall()

    def cpu_seconds(self) -> float:
        """CPU time redis-server has used (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def used_mib(self) -> float:
        return int(self.client.info("memory")["used_memory"]) / 2**20

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._log.close()


class Stores:
    """Where each connector's blocks go: folders under one scratch folder, one Redis."""

    def __init__(self, connectors: list[str], args: argparse.Namespace, scratch: Path) -> None:
        self.scratch = scratch
        self.redis: Redis | None = None
        self._n = 0
        if "redis" in connectors:
            binary = args.redis_server or shutil.which("redis-server")
            if binary is None:
                raise SystemExit("redis-server not found (apt-get install redis-server) or pass --redis-server")
            self.redis = Redis(binary, scratch / "redis.log")

    def fresh(self, connector: str, role: str) -> dict[str, Any]:
        """A ``--kv-transfer-config`` for ``connector`` over an empty store."""
        if connector == "shared":
            self._n += 1
            folder = self.scratch / f"store-{self._n}"
            folder.mkdir()
            extra: dict[str, Any] = {"shared_storage_path": str(folder)}
        else:
            assert self.redis is not None
            self.redis.flush()
            extra = {"url": self.redis.url}
        return {"kv_connector": CONNECTORS[connector], "kv_role": role, "kv_connector_extra_config": extra}

    @staticmethod
    def same(config: dict[str, Any], role: str) -> dict[str, Any]:
        """``config``'s store, in another role."""
        return {**config, "kv_role": role}

    def count(self, config: dict[str, Any]) -> int:
        """Blocks in ``config``'s store."""
        extra = config["kv_connector_extra_config"]
        if "shared_storage_path" in extra:
            return sum(1 for _ in Path(extra["shared_storage_path"]).rglob("*.safetensors"))
        assert self.redis is not None
        return int(self.redis.client.dbsize())

    def wait_saved(self, config: dict[str, Any], quiet_s: float = 0.3, timeout: float = 120) -> float:
        """Wait until no block has been added to the store for ``quiet_s``; the seconds
        until the last one appeared."""
        started = last_change = time.perf_counter()
        seen = self.count(config)
        while time.perf_counter() - last_change < quiet_s and time.perf_counter() - started < timeout:
            time.sleep(0.01)
            now = self.count(config)
            if now != seen:
                seen, last_change = now, time.perf_counter()
        return last_change - started

    def size_mib(self, config: dict[str, Any]) -> float:
        extra = config["kv_connector_extra_config"]
        if "shared_storage_path" in extra:
            return sum(f.stat().st_size for f in Path(extra["shared_storage_path"]).rglob("*") if f.is_file()) / 2**20
        assert self.redis is not None
        return self.redis.used_mib()

    def drop(self, config: dict[str, Any]) -> None:
        extra = config["kv_connector_extra_config"]
        if "shared_storage_path" in extra:
            shutil.rmtree(extra["shared_storage_path"], ignore_errors=True)
        elif self.redis is not None:
            self.redis.flush()

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()


# ------------------------------------------------------------------ TTFT, served

class Server:
    """A ``forkless serve`` of the benchmark's model, optionally with a KV connector."""

    def __init__(self, model: str | None, args: argparse.Namespace, kv: dict[str, Any] | None, name: str,
                 scratch: Path) -> None:
        import openai

        serve = [model] if model else []
        serve += ["--max-model-len", str(args.prefix_tokens + args.new_tokens + 16), "--uvicorn-log-level",
                  "warning", "--load-format", args.load_format, "--dtype", args.dtype, "--kv-cache-memory",
                  str(int(args.kv_cache_gib * 2**30)), *args.server_args]
        if kv is not None:
            serve += ["--kv-transfer-config", json.dumps(kv)]
        self.port = free_port()
        self.log = open(scratch / f"server-{name}-{self.port}.log", "wb")
        env = {**os.environ, "FORKLESS_PLUGINS": ""}
        self.proc, self.startup_s = start_server(serve, self.port, self.log, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=1800)
        self.model = self.client.models.list().data[0].id

    def ttft(self, prompt: list[int]) -> float:
        """Seconds from sending a streaming completion of ``prompt`` to its first chunk."""
        started = time.perf_counter()
        stream = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=1, temperature=0.0,
                                                stream=True)
        first = None
        for _chunk in stream:
            if first is None:
                first = time.perf_counter() - started
        assert first is not None, "the stream returned no chunk"
        return first

    def metrics(self) -> dict[str, float]:
        """The KV-connector counters of ``/metrics`` (those the server exports)."""
        import httpx

        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            for name in METRICS:
                if line.startswith(name + "_total") or line.startswith(name + "{") or line.startswith(name + " "):
                    out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        stop_server(self.proc)
        self.log.close()


def ttft_section(model: str | None, vocab: int, connectors: list[str], stores: Stores,
                 args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    prompts = [ids(args.prefix_tokens) for _ in range(args.prompts)]
    asks = [p + ids(args.new_tokens) for p in prompts]  # what the second engine is sent
    warm = ids(min(256, args.prefix_tokens))  # warm-up, stored by the producers too
    warm_ask = warm + ids(args.new_tokens)
    print(f"\nTTFT: {args.prompts} prompts of {args.prefix_tokens} tokens; the fresh consumer and the baseline "
          f"get each + {args.new_tokens} new tokens (streaming, max_tokens=1); all servers up at once, one request "
          f"at a time, interleaved prompt by prompt; times in ms", flush=True)
    # Every server is up before the first timed request, and the requests alternate
    # between them prompt by prompt: on a shared machine a slow spell lands on all sides.
    servers: dict[str, Server] = {}
    kv: dict[str, dict[str, Any]] = {}
    try:
        servers["baseline"] = Server(model, args, None, "baseline", scratch)
        for name in connectors:
            kv[name] = stores.fresh(name, "kv_producer")
            servers[f"{name}_producer"] = Server(model, args, kv[name], f"{name}-producer", scratch)
            servers[name] = Server(model, args, Stores.same(kv[name], "kv_consumer"), f"{name}-consumer", scratch)
        print("  servers up (start -> /health OK): " + ", ".join(f"{k} {s.startup_s:.1f} s"
                                                                  for k, s in servers.items()), flush=True)
        servers["baseline"].ttft(warm_ask)
        for name in connectors:
            servers[f"{name}_producer"].ttft(warm)
            stores.wait_saved(kv[name])
            servers[name].ttft(warm_ask)
        before = {name: servers[name].metrics() for name in connectors}
        results: dict[str, Any] = {key: [] for key in servers}
        settle: dict[str, list[float]] = {name: [] for name in connectors}
        for i in range(args.prompts):
            results["baseline"].append(servers["baseline"].ttft(asks[i]))
            for name in connectors:
                results[f"{name}_producer"].append(servers[f"{name}_producer"].ttft(prompts[i]))
                # Asynchronous saves may still be writing: the consumer is asked once the
                # store holds the whole prompt (the time that took is printed).
                settle[name].append(stores.wait_saved(kv[name]))
                results[name].append(servers[name].ttft(asks[i]))
            print(f"  [{i}] " + "  ".join(f"{k} {v[-1] * 1000:.0f}" for k, v in results.items()), flush=True)
        after = {name: servers[name].metrics() for name in connectors}
        sizes = {name: stores.size_mib(kv[name]) for name in connectors}
    finally:
        for server in servers.values():
            server.stop()
        for config in kv.values():
            stores.drop(config)

    def show(label: str, times: list[float]) -> None:
        print(f"  {label:<34} " + " ".join(f"{t * 1000:8.0f}" for t in times)
              + f"   median {statistics.median(times) * 1000:8.0f} ms", flush=True)

    show("no connector (recomputed)", results["baseline"])
    for name in connectors:
        show(f"{name}: producer (compute + save)", results[f"{name}_producer"])
        show(f"{name}: fresh consumer (loaded)", results[name])
        print(f"    store complete {1000 * statistics.median(settle[name]):.0f} ms (median) after the producer's "
              f"first token; per-prompt ratio baseline / loaded: "
              + " ".join(f"{b / c:.2f}" for b, c in zip(results["baseline"], results[name])), flush=True)
        got = {k.split(":", 1)[1]: after[name].get(k, 0.0) - before[name].get(k, 0.0) for k in METRICS
               if k in after[name]}
        if got:
            loaded = got.get("kv_transfer_load_bytes", 0.0)
            print(f"    consumer /metrics over the timed requests: {got.get('external_prefix_cache_hits', 0):.0f} of "
                  f"{got.get('external_prefix_cache_queries', 0):.0f} queried tokens found in the store, "
                  f"{loaded / 2**20:.1f} MiB loaded in {got.get('kv_transfer_load_seconds', 0.0):.3f} s "
                  f"(store held {sizes[name]:.1f} MiB)", flush=True)
        else:
            print(f"    (the consumer exports no KV-connector metrics; store held {sizes[name]:.1f} MiB)", flush=True)
        results[f"{name}_metrics"] = got
        results[f"{name}_settle"] = settle[name]
    return results


# ------------------------------------------------------------------ throughput, offline

def throughput_run(model: str | None, work: list[list[int]], kv: dict[str, Any] | None,
                   args: argparse.Namespace) -> tuple[float, float]:
    """Output tokens per second of one ``LLM.generate`` over every prompt, on a fresh ``LLM``,
    and the CPU seconds this process (the engine runs in it, with its worker) used for it."""
    from forkless import LLM, SamplingParams

    llm = LLM(model, kv_transfer_config=kv, max_model_len=args.prompt_len + args.output_len + 16,
              max_num_seqs=max(args.num_requests, 1), load_format=args.load_format, dtype=args.dtype)
    try:
        rng = random.Random(-1)
        warm = [{"prompt_token_ids": [rng.randrange(100, 1000) for _ in range(64)]} for _ in range(2)]
        llm.generate(warm, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        started, cpu = time.perf_counter(), time.process_time()
        outs = llm.generate([{"prompt_token_ids": p} for p in work], params, use_tqdm=False)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        assert tokens == len(work) * args.output_len, "not every requested token was produced"
        return tokens / elapsed, cpu
    finally:
        llm.shutdown()


def throughput_section(model: str | None, vocab: int, connectors: list[str], stores: Stores,
                       args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    work = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
    print(f"\nThroughput: {args.num_requests} requests, {args.prompt_len}-token distinct prompts, "
          f"{args.output_len} output tokens each, offline LLM.generate; output tok/s, kv_producer saving every "
          f"prompt block", flush=True)
    best: dict[str, Any] = dict.fromkeys(["none", *connectors], 0.0)
    pairs: dict[str, list[float]] = {name: [] for name in connectors}  # against the run just before
    for r in range(args.repeats):
        rate, cpu_s = throughput_run(model, work, None, args)
        none_rate = rate
        best["none"] = max(best["none"], rate)
        print(f"  [{r}] no connector: {rate:8.1f} tok/s ({cpu_s:.1f} CPU s)", flush=True)
        for name in connectors:
            kv = stores.fresh(name, "kv_producer")
            cpu = stores.redis.cpu_seconds() if name == "redis" and stores.redis is not None else 0.0
            rate, cpu_s = throughput_run(model, work, kv, args)
            size = stores.size_mib(kv)
            if name == "redis" and stores.redis is not None:
                size_note = f", redis-server used {stores.redis.cpu_seconds() - cpu:.1f} s of CPU"
            else:
                size_note = ""
            stores.drop(kv)
            best[name] = max(best[name], rate)
            pairs[name].append(rate / none_rate)
            print(f"  [{r}] {name} producer: {rate:8.1f} tok/s ({cpu_s:.1f} CPU s; {size:.0f} MiB saved{size_note})",
                  flush=True)
    best["pairs"] = pairs
    return best


# ------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    ap.add_argument("--shape", default=None, help="write a model folder of this known shape (e.g. qwen3-0.6b) and "
                    "use it instead of --model; pair with --load-format dummy")
    ap.add_argument("--shape-layers", type=int, default=None, help="with --shape: this many layers (a small "
                    "model of the real width, for a check on CPU)")
    ap.add_argument("--load-format", default="auto", help="auto, or dummy (random weights)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--connectors", nargs="+", default=["shared", "redis"], choices=sorted(CONNECTORS))
    ap.add_argument("--prefix-tokens", type=int, default=1500, help="TTFT: tokens of each stored prompt")
    ap.add_argument("--new-tokens", type=int, default=16, help="TTFT: new tokens the second engine's request adds")
    ap.add_argument("--prompts", type=int, default=5, help="TTFT: distinct prompts (the median counts)")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0, help="TTFT: KV-cache size of each server (five "
                    "are up at once)")
    ap.add_argument("--num-requests", type=int, default=32, help="throughput: requests")
    ap.add_argument("--prompt-len", type=int, default=500, help="throughput: prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=64, help="throughput: output tokens per request")
    ap.add_argument("--repeats", type=int, default=2, help="throughput: runs of each, interleaved; the best counts")
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--redis-server", default=None, help="the redis-server binary (default: on PATH)")
    ap.add_argument("--scratch", default=None, help="folder for the stores and logs (default: a temporary "
                    "folder under $TMPDIR, removed at the end)")
    ap.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="more `forkless serve` flags for every TTFT server (last on the line)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args()

    from forkless.model_loader.default_model import resolve_model_path

    own_scratch = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix="forkless-kvbench-") if own_scratch else args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    model: str | None = args.model
    if args.shape:
        from forkless.bench.shapes import write_model_folder

        model = str(write_model_folder(scratch / args.shape, args.shape, num_layers=args.shape_layers))
    folder = resolve_model_path(model)
    hf = json.loads((folder / "config.json").read_text())
    vocab = int(hf.get("vocab_size") or hf["text_config"]["vocab_size"])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "?")
    print(f"model {model or 'default (SmolLM2-135M)'} ({hf.get('num_hidden_layers')} layers), CPU {cpu} x "
          f"{os.cpu_count()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    stores = Stores(args.connectors, args, scratch)
    results: dict[str, Any] = {"args": vars(args), "load_average_start": os.getloadavg()}
    try:
        if not args.skip_ttft:
            results["ttft"] = ttft_section(model, vocab, args.connectors, stores, args, scratch)
        if not args.skip_throughput:
            results["throughput"] = throughput_section(model, vocab, args.connectors, stores, args)
    finally:
        stores.stop()
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    results["load_average_end"] = os.getloadavg()

    print("\nSummary")
    bars = {"shared": 5.0, "redis": 3.0}
    if "ttft" in results:
        t = results["ttft"]
        base = statistics.median(t["baseline"])
        print(f"  TTFT, no connector (recomputed): median {base * 1000:.0f} ms")
        for name in args.connectors:
            loaded = statistics.median(t[name])
            saved = statistics.median(t[f"{name}_producer"])
            pairs = statistics.median(b / c for b, c in zip(t["baseline"], t[name]))
            print(f"  TTFT through {CONNECTORS[name]}: median {loaded * 1000:.0f} ms loaded = **{base / loaded:.2f}x "
                  f"lower** (median of the per-prompt ratios {pairs:.2f}x; bar {bars[name]:.0f}x on CPU); the "
                  f"producer's (compute + save) {saved * 1000:.0f} ms = {saved / base:.2f}x the baseline's")
    if "throughput" in results:
        b = results["throughput"]
        for name in args.connectors:
            print(f"  throughput with a kv_producer {CONNECTORS[name]}: best {b[name]:.1f} vs {b['none']:.1f} tok/s = "
                  f"**{b[name] / b['none']:.3f}x** (cost {100 * (1 - b[name] / b['none']):.1f} %, bar <= 10 %); "
                  f"against the run just before it: median {statistics.median(b['pairs'][name]):.3f}x "
                  f"({', '.join(f'{x:.2f}' for x in b['pairs'][name])})")
    print(f"  load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())} (the machine may be shared)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
