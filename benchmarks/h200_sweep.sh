#!/bin/bash
# Request-rate sweep and --max-concurrency 64 against one `forkless serve` on one H200, in one
# device call (benchmarks/README.md, "The server against the offline engine on the H200").
# Same workload shape as h200_serve.sh: Qwen3-0.6B shape, bf16, dummy weights, 512 requests,
# input and output lengths uniform in 100-1,024. One server serves every run (started once).
# Usage (device machine, repo root; wheels of what the machine lacks in .venv-whl/):
#   RATES="8 16 32 64 inf" bash benchmarks/h200_sweep.sh   # writes sweep.tgz + a table under $OUT
OUT=${OUT:-h200-out}; mkdir -p "$OUT/sweep"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F="python3 -m forkless.entrypoints.cli.main"
N=${N:-512}; PORT=${PORT:-8011}
python3 -c "from pathlib import Path; from forkless.bench.shapes import write_model_folder; \
write_model_folder(Path('/tmp/qwen3-0.6b'), 'qwen3-0.6b')"
$F serve /tmp/qwen3-0.6b --port $PORT --load-format dummy --dtype bfloat16 --max-num-seqs 512 --max-model-len 2048 \
  --async-scheduling --disable-log-stats > "$OUT/sweep/server.log" 2>&1 &
SERVER=$!
for i in $(seq 1200); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 0.1; done
run() {  # $1: label, then bench serve flags
  local label=$1; shift
  timeout 300 $F bench serve --base-url http://127.0.0.1:$PORT --tokenizer /tmp/qwen3-0.6b --dataset-name random \
    --random-input-len 562 --random-output-len 562 --random-range-ratio 0.822 --num-prompts $N \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --save-result --result-dir "$OUT/sweep" \
    --result-filename "$label.json" "$@" > "$OUT/sweep/$label.log" 2>&1
}
for RATE in ${RATES:-8 16 32 64 inf}; do run "rate_$RATE" --request-rate "$RATE"; done
run "concurrency_64" --request-rate inf --max-concurrency 64
kill -TERM $SERVER; wait $SERVER
python3 - "$OUT/sweep" <<'PY' | tee "$OUT/sweep_table.md"
import json, sys, pathlib
rows = sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: p.stat().st_mtime)
print("| run | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) |")
print("|---|---:|---:|---:|---:|")
for p in rows:
    d = json.loads(p.read_text())
    print(f"| {p.stem} | {d['output_throughput']:,.0f} | {d['p50_ttft_ms']:.0f} / {d['p99_ttft_ms']:.0f} | "
          f"{d['p50_tpot_ms']:.1f} / {d['p99_tpot_ms']:.1f} | {d['p50_itl_ms']:.2f} / {d['p99_itl_ms']:.1f} |")
PY
(cd "$OUT" && tar czf sweep.tgz sweep && rm -rf sweep)
