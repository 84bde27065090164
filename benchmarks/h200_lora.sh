#!/bin/bash
# Multi-LoRA on one H200, in one device call (see benchmarks/README.md, "Multi-LoRA"): the
# GPU LoRA tests (Triton shrink/expand kernels against the torch path, eager and in a CUDA
# graph; mixed batch equals each request alone), then benchmarks/lora.py on the Qwen3-0.6B
# shape with dummy weights and adapters: 8 rank-16 adapters over 64 requests, and 32
# adapters with --max-loras 4.
# Usage (device machine, repo root; wheels of what the machine lacks in .venv-whl/ -- msgspec,
# pyzmq, ... as for h200_serve.sh -- and pytest with its dependencies in .lora-whl/):
#   bash benchmarks/h200_lora.sh        # writes logs and JSON under $OUT (or ./h200-out)
#   PARTS="kernels bench8" bash benchmarks/h200_lora.sh   # some parts only (kernels bench8 e2e bench32)
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .venv-whl/*.whl .lora-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.log"
B="python3 benchmarks/lora.py --shape qwen3-0.6b --load-format dummy --dtype bfloat16 --max-model-len 1024 --repeats 1"
# The kernels first (quick), then the benchmark, then the end-to-end tests, then swapping.
F='^INFO.*(Loading|loaded adapter|evicted adapter)'
PARTS=" ${PARTS:-kernels bench8 e2e bench32} "
[[ $PARTS == *" kernels "* ]] && timeout ${T_KERNELS:-50} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_lora_triton.py -k kernels 2>&1 \
  | tail -30 | tee "$OUT/tests_kernels.log"
[[ $PARTS == *" bench8 "* ]] && timeout ${T_BENCH:-90} $B --json "$OUT/bench8.json" 2>&1 | grep -E -v "$F" | tail -30 | tee "$OUT/bench8.log"
[[ $PARTS == *" e2e "* ]] && timeout ${T_E2E:-100} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_lora_triton.py -k "not kernels" 2>&1 \
  | grep -E -v "$F" | tail -40 | tee "$OUT/tests_e2e.log"
[[ $PARTS == *" bench32 "* ]] && timeout ${T_SWAP:-60} $B --adapters 32 --max-loras 4 --json "$OUT/bench32.json" 2>&1 | grep -E -v "$F" | tail -30 \
  | tee "$OUT/bench32.log"
