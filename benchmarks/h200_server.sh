#!/bin/bash
# Start-up time, then the server against the offline engine, on one H200 in one device call
# (benchmarks/README.md, "Third session"). Same workload as h200_serve.sh: Qwen3-0.6B shape,
# bf16, dummy weights, 512 requests, input and output lengths uniform in 100-1,024. One
# server serves every run: two plain runs, --max-concurrency 64, then one under py-spy.
# Usage (device machine, repo root; wheels of what the machine lacks in .venv-whl/):
#   bash benchmarks/h200_server.sh        # writes logs, JSON, profiles and table.md under $OUT
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F="python3 -m forkless.entrypoints.cli.main"
SERVE="$F serve /tmp/qwen3-0.6b --load-format dummy --dtype bfloat16 --max-num-seqs 512 --max-model-len 2048 --async-scheduling --disable-log-stats"
python3 -c "from pathlib import Path; from forkless.bench.shapes import write_model_folder; write_model_folder(Path('/tmp/qwen3-0.6b'), 'qwen3-0.6b')"
health() {  # $1: port; prints the seconds since $2 (date +%s.%N) once /health answers ($3: the
  # server's pid: gives up at once if it has exited)
  for i in $(seq 1200); do curl -sf "localhost:$1/health" > /dev/null && break
    kill -0 "$3" 2> /dev/null || { echo "the server exited"; return; }; sleep 0.1; done
  python3 -c "print(round($(date +%s.%N) - $2, 2))"; }
# 1. A first start, every process profiled (also fills Triton's kernel cache, as any earlier start would).
/tmp/site/bin/py-spy record --subprocesses -r 50 -f raw -o "$OUT/start_prof.txt" --nonblocking -- \
  $SERVE --port 8012 > "$OUT/start1.log" 2>&1 &
SPY=$!; T0=$(date +%s.%N)
echo "start -> /health, under py-spy: $(health 8012 $T0 $SPY) s" | tee "$OUT/start_summary.txt"
pkill -TERM -f "^python3 -m forkless.entrypoints.cli.main serve /tmp/qwen3-0.6b .* --port 8012"; sleep 5
pkill -9 -f "^python3 -m forkless.entrypoints.cli.main serve /tmp/qwen3-0.6b .* --port 8012"; wait $SPY
# 2. Offline, with the floor.
timeout 200 $F bench throughput --shape qwen3-0.6b --load-format dummy --dtype bfloat16 -n 512 --max-num-seqs 512 \
  --async-scheduling --skip-hf --peak-tflops 790 --json "$OUT/offline.json" 2>&1 | grep -v "^INFO" | tail -4 | tee "$OUT/offline.log"
# 3. The server, started once.
PORT=8011; T0=$(date +%s.%N)
$SERVE --port $PORT > "$OUT/server.log" 2>&1 &
SERVER=$!
echo "start -> /health: $(health $PORT $T0 $SERVER) s" | tee -a "$OUT/start_summary.txt"
run() { local label=$1; shift
  timeout 200 $F bench serve --base-url http://127.0.0.1:$PORT --tokenizer /tmp/qwen3-0.6b --dataset-name random \
    --random-input-len 562 --random-output-len 562 --random-range-ratio 0.822 --num-prompts 512 \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --save-result --result-dir "$OUT" \
    --result-filename "$label.json" "$@" > "$OUT/$label.log" 2>&1; }
run inf_1 --request-rate inf
run inf_2 --request-rate inf
run conc_64 --request-rate inf --max-concurrency 64
(sleep 4; /tmp/site/bin/py-spy record -p $SERVER -d 12 -r 100 -f raw -o "$OUT/api_prof.txt" --nonblocking >/dev/null 2>&1) &
SPY=$!
run inf_prof --request-rate inf
wait $SPY
kill -TERM $SERVER; wait $SERVER
python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
offline = json.loads((out / "offline.json").read_text())["forkless"]["tokens_per_s"]
print(f"offline: {offline:,.0f} output tok/s")
print("| run | output tok/s | vs offline | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | duration s |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in ("inf_1", "inf_2", "conc_64", "inf_prof"):
    p = out / f"{name}.json"
    if not p.exists():
        print(f"| {name} | missing |"); continue
    d = json.loads(p.read_text())
    print(f"| {name} | {d['output_throughput']:,.0f} | {d['output_throughput'] / offline:.2f}x | {d['p50_ttft_ms']:.0f} / {d['p99_ttft_ms']:.0f} | "
          f"{d['p50_tpot_ms']:.1f} / {d['p99_tpot_ms']:.1f} | {d['p50_itl_ms']:.2f} / {d['p99_itl_ms']:.1f} | {d['duration']:.2f} |")
PY
cat "$OUT/start_summary.txt"
