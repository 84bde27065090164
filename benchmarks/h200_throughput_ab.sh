#!/bin/bash
# Issue 14 on one GPU: two settings of the offline throughput workload, alternated ROUNDS
# times in one call (the call's first run also compiles Triton kernels), then each run's
# time over the floor and the ratio of the medians (B's time / A's).
# A and B are "label|VAR=value ...|extra flags" (either part may be empty). Examples
# (benchmarks/README.md):
#   A="piecewise||" B="decode-only||--compilation-config {\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}" \
#     ROUNDS=2 bash benchmarks/h200_throughput_ab.sh
#   A="default||" B="no-fused|FORKLESS_FUSED_KERNELS=0|" ROUNDS=2 bash benchmarks/h200_throughput_ab.sh
# Wheels carried in .venv-whl/ as for h200_run.sh.
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
for round in $(seq "${ROUNDS:-2}"); do for setting in "$A" "$B"; do
  IFS='|' read -r label assignments flags <<< "$setting"
  log="$OUT/ab_${label}_$round.log"
  # shellcheck disable=SC2086  # word splitting of the assignments and flags is intended
  env $assignments timeout "${RUN_TIMEOUT:-120}" python3 -m forkless.entrypoints.cli.main bench throughput \
    --shape qwen3-0.6b --load-format dummy --dtype bfloat16 -n 512 --max-num-seqs 512 --async-scheduling \
    --skip-hf --peak-tflops 790 $flags --json "$OUT/ab_${label}_$round.json" > "$log" 2>&1
  echo "round $round $label rc=$? $(grep -E 'forkless / floor' "$log")"
  grep -E "captured|Error" "$log" | cut -c1-200 | sed 's/^/    /' | head -4
done; done
python3 - "$OUT" "${A%%|*}" "${B%%|*}" <<'PY'
import json, statistics, sys
from pathlib import Path
out, a, b = sys.argv[1:]
runs = {m: [json.loads(p.read_text())["floor"]["ratio"] for p in sorted(Path(out).glob(f"ab_{m}_*.json"))] for m in (a, b)}
print({m: [round(r, 3) for r in v] for m, v in runs.items()})
if all(runs.values()):
    ma, mb = (statistics.median(runs[m]) for m in (a, b))
    print(f"median x the floor: {a} {ma:.3f}, {b} {mb:.3f}: {b} takes {mb / ma:.3f}x {a}'s time")
PY
