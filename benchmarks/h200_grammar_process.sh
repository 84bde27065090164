#!/bin/bash
# Issue 17 on one H200: the constrained step's overhead at batch 256 (Qwen3-0.6B shape, bf16,
# dummy weights, async, the server's `mp` executor), the settings of SETTINGS alternated
# ROUNDS times (see benchmarks/README.md, "The grammar process"): 0 = the grammars in the
# engine core (FORKLESS_GRAMMAR_PROCESS=0), N >= 1 = N grammar processes
# (FORKLESS_GRAMMAR_PROCESSES=N), default = neither variable set. Default SETTINGS="1 2 4".
# STEP_MEDIAN: alternations of the per-step median (default 4).
# Prepared here (this machine):
#   python benchmarks/qwen_tokenizer.py .dev/qtok         # the Qwen vocabulary
#   cd .venv-whl && for py in 3.11 3.12 3.13; do pip download --no-deps --only-binary=:all: \
#     --python-version $py --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     msgspec pyzmq xgrammar apache-tvm-ffi gguf pydantic pydantic_core annotated-types \
#     typing-inspection jsonschema jsonschema-specifications referencing rpds-py; done  # (--check: jsonschema)
#   pip download --no-deps llguidance  # the local venv's versions
#     (llguidance's wheel is abi3, manylinux_2_31: the platform flags above do not find it)
# then on the device, carrying .venv-whl and .dev: bash benchmarks/h200_grammar_process.sh
# The image lacks all of these; xgrammar's request validation imports llguidance (without it
# every constrained request fails), and xgrammar needs apache-tvm-ffi.
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .venv-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c 'import sys, torch, xgrammar, llguidance; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())' || exit 1
for round in $(seq "${ROUNDS:-2}"); do for gp in ${SETTINGS:-1 2 4}; do
  log="$OUT/round${round}_gp${gp}.log"
  echo "== round $round grammar processes: $gp ${EXECUTOR:-mp}"
  if [ "$gp" = default ]; then unset FORKLESS_GRAMMAR_PROCESS FORKLESS_GRAMMAR_PROCESSES
  else export FORKLESS_GRAMMAR_PROCESS=$((gp > 0)) FORKLESS_GRAMMAR_PROCESSES=$((gp > 0 ? gp : 1)); fi
  timeout "${RUN_TIMEOUT:-200}" python3 benchmarks/structured_outputs.py --shape qwen3-0.6b \
    --batch 256 --max-tokens 64 --dtype bfloat16 --repeats 1 --step-median "${STEP_MEDIAN:-4}" --async-scheduling --no-detokenize \
    --tokenizer-from .dev/qtok --distributed-executor-backend "${EXECUTOR:-mp}" ${CHECK---check} > "$log" 2>&1
  echo "rc=$?"; grep -E "grammar process:|batch 256|median decode|^check:|Error" "$log" | head -8
done; done
