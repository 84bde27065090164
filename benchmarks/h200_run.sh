#!/bin/bash
# Everything issue 6 measures on one H200, in one device call (see benchmarks/README.md).
# Usage (device machine, repo root, wheels of msgspec/pyzmq carried in .venv-whl/):
#   bash benchmarks/h200_run.sh        # writes logs and JSON under $OUT (or ./h200-out)
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F="python3 -m forkless.entrypoints.cli.main"
# Host work of step N+1 overlaps the device's step N (ASYNC= to measure synchronous steps).
ASYNC=${ASYNC---async-scheduling}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/env.log"
[ "${SKIP_TESTS:-0}" = 1 ] || timeout 200 python3 -m pytest tests/gpu -q -x -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
[ "${SKIP_THROUGHPUT:-0}" = 1 ] || timeout ${TP_TIMEOUT:-240} $F bench throughput --shape qwen3-0.6b --load-format dummy --dtype bfloat16 -n 512 \
  --max-num-seqs ${MAX_SEQS:-512} $ASYNC --hf-batch-size 64 --hf-max-batches ${HF_BATCHES:-1} --json "$OUT/throughput.json" \
  2>&1 | tee "$OUT/throughput.log" | grep -v "^INFO"
[ "${SKIP_LATENCY:-0}" = 1 ] || timeout 120 $F bench latency --shape llama3-8b --load-format dummy --dtype bfloat16 \
  --prompt-len 128 --output-len 256 $ASYNC --json "$OUT/latency.json" 2>&1 | grep -v "^INFO" | tee "$OUT/latency.log"
# The same workload with synchronous steps, forkless only: what the overlap buys.
[ "${SKIP_SYNC:-0}" = 1 ] || timeout 100 $F bench throughput --shape qwen3-0.6b --load-format dummy --dtype bfloat16 -n 512 \
  --max-num-seqs ${MAX_SEQS:-512} --skip-hf --json "$OUT/throughput_sync.json" 2>&1 | grep -v "^INFO" | tail -4
[ "${SKIP_PROFILE:-0}" = 1 ] || timeout 90 python3 -m cProfile -o "$OUT/throughput.prof" -m forkless.entrypoints.cli.main \
  bench throughput --shape qwen3-0.6b --load-format dummy --dtype bfloat16 -n 256 --output-len 100 300 \
  --max-num-seqs 256 $ASYNC --skip-hf 2>&1 | grep -v "^INFO" | tail -3
[ -f "$OUT/throughput.prof" ] && python3 -c "
import pstats; s = pstats.Stats('$OUT/throughput.prof'); s.sort_stats('tottime').print_stats(22)" 2>&1 | tail -40 | tee "$OUT/profile.txt"
