#!/bin/bash
# The server against the offline engine on one H200, in one device call (see benchmarks/README.md,
# "Server against offline on the H200"). Same workload shape both ways: Qwen3-0.6B shape, bf16,
# dummy weights, 512 requests, input and output lengths uniform in 100-1,024 (bench serve's
# random dataset for both).
# Usage (device machine, repo root; wheels of what the machine lacks -- msgspec, pyzmq, gguf, py-spy,
# fastapi, uvicorn, openai and their dependencies, the versions of the local venv -- in .venv-whl/;
# recent fastapi needs opentelemetry-api, which the device image lacks: without it the server exits at start):
#   bash benchmarks/h200_serve.sh        # writes logs and JSON under $OUT (or ./h200-out)
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F="python3 -m forkless.entrypoints.cli.main"
N=${N:-512}
python3 -c "import forkless.entrypoints.openai.api_server, openai, uvicorn" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.log"
# The offline engine on the very requests `bench serve` sends below (its random dataset's
# flags and seed), so that the two rates compare the same work. 100-1,024 = 562 x (1 -/+ 0.822),
# vLLM's --random-range-ratio.
SAME="--random-input-len 562 --random-output-len 562 --random-range-ratio 0.822"
[ "${SKIP_OFFLINE:-0}" = 1 ] || timeout 240 $F bench throughput --shape qwen3-0.6b --load-format dummy --dtype bfloat16 \
  -n $N --max-num-seqs 512 --async-scheduling --skip-hf --peak-tflops 790 $SAME --json "$OUT/offline.json" 2>&1 \
  | grep -v "^INFO" | tail -8 | tee "$OUT/offline.log"
python3 -c "from pathlib import Path; from forkless.bench.shapes import write_model_folder; \
write_model_folder(Path('/tmp/qwen3-0.6b'), 'qwen3-0.6b')"
for MODE in ${MODES:-async sync}; do
  A=""; [ "$MODE" = async ] && A=--async-scheduling
  # Profiles of the API server, engine core and worker processes while the requests stream
  # (SPY_AT=off: none; the run is not waited for beyond its own end then).
  [ "${SPY_AT:-30}" = off ] || (sleep "${SPY_AT:-30}"; P=$(pgrep -f "cli.main serve /tmp/qwen3-0.6b" | head -1); [ -z "$P" ] && exit
   C=$(pgrep -P "$P" -f spawn_main | tail -1); W=$([ -n "$C" ] && pgrep -P "$C" -f spawn_main | tail -1)
   B=$(pgrep -f "cli.main bench serve" | head -1)  # the benchmark's own client
   for X in "api:$P" "core:$C" "worker:$W" "client:$B"; do
     [ -n "${X#*:}" ] && /tmp/site/bin/py-spy record -p "${X#*:}" -d 10 -r 100 -f raw \
       -o "$OUT/${X%%:*}_$MODE.txt" --nonblocking > /dev/null 2>&1 &
   done; wait) &
  # Per-step timings of the worker (device busy / idle per step), summarised below.
  export FORKLESS_STEP_TRACE_DIR="$OUT/trace_$MODE"
  timeout 300 $F bench serve --model /tmp/qwen3-0.6b --dataset-name random $SAME --num-prompts $N --request-rate inf \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --save-result --result-dir "$OUT" \
    --result-filename "serve_$MODE.json" --server-args --load-format dummy --dtype bfloat16 --max-num-seqs 512 \
    --max-model-len 2048 $A 2>&1 | grep -v "^INFO" | tee "$OUT/serve_$MODE.log"
  wait
  unset FORKLESS_STEP_TRACE_DIR
  python3 -m forkless.metrics.step_trace "$OUT/trace_$MODE" | tee -a "$OUT/serve_$MODE.log"
  rm -rf "$OUT/trace_$MODE"
done
# One archive of the profiles (the device call returns a limited number of files).
(cd "$OUT" && P=$(ls ./*_async.txt ./*_sync.txt 2>/dev/null); [ -n "$P" ] && tar czf profiles.tgz $P && rm -f $P)
