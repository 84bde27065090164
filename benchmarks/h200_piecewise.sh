#!/bin/bash
# Issue 14 on one GPU: prefill and mixed steps as piecewise CUDA graphs (cudagraph_mode
# FULL_AND_PIECEWISE, the default) against eager prefill and mixed steps (FULL_DECODE_ONLY),
# on the offline throughput workload, the two alternated ROUNDS times in one call (the
# first run of a call also compiles Triton kernels). Prints each run and the ratio of the
# medians. See benchmarks/README.md ("Piecewise CUDA graphs for prefill and mixed steps").
# Usage (device machine, repo root, wheels carried in .venv-whl/ as for h200_run.sh):
#   ROUNDS=2 bash benchmarks/h200_piecewise.sh
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F="python3 -m forkless.entrypoints.cli.main"
for round in $(seq "${ROUNDS:-2}"); do for mode in FULL_AND_PIECEWISE FULL_DECODE_ONLY; do
  log="$OUT/piecewise_${mode}_$round.log"
  timeout "${RUN_TIMEOUT:-120}" $F bench throughput --shape qwen3-0.6b --load-format dummy --dtype bfloat16 -n 512 \
    --max-num-seqs 512 --async-scheduling --skip-hf --peak-tflops 790 \
    --compilation-config "{\"cudagraph_mode\": \"$mode\"}" --json "$OUT/piecewise_${mode}_$round.json" > "$log" 2>&1
  echo "round $round $mode rc=$? $(grep -E 'forkless / floor' "$log")"
  grep -E "captured|ready in|Error" "$log" | sed 's/^/    /' | head -6
done; done
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
runs = {m: [json.loads(p.read_text())["floor"]["ratio"] for p in sorted(Path(sys.argv[1]).glob(f"piecewise_{m}_*.json"))]
        for m in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")}
print({m: [round(r, 3) for r in v] for m, v in runs.items()})
if all(runs.values()):
    a, b = (statistics.median(runs[m]) for m in runs)
    print(f"median x the floor: piecewise {a:.3f}, decode-only {b:.3f}: piecewise takes {a / b:.3f}x the time")
PY
