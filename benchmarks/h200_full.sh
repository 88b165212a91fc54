#!/usr/bin/env bash
# The closing H200 batch: fast's conformance checks (gpu profile, bf16 included), the fp32
# "plain" mode's SDPA checks, then benchmarks.sdpa and benchmarks.dsa under time budgets.
# Everything lands in $OUT/results.tgz (one file back). Usage: OUT=dir bash benchmarks/h200_full.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
R="$OUT/r"
mkdir -p "$R"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$R/gpu.txt" 2>&1
OUT="$R" BUDGET=${SUITE_S:-100} WORKERS=14 bash .ci/gpu fast --impl fast attention_oracle/conformance | tail -25
ATTENTION_ORACLE_FAST_FP32=plain OUT="$R" BUDGET=${PLAIN_S:-50} WORKERS=14 bash .ci/gpu fp32plain --impl fast \
    attention_oracle/conformance/test_sdpa.py -k "forward_agreement or gradient_agreement or fully_masked" | tail -12
timeout ${SDPA_S:-150} python3 -m benchmarks.sdpa --lengths 1024,4096,16384 --precompile 14 --no-rank3 \
    --no-memory --budget-s ${SDPA_BUDGET:-105} --out "$R/bench_sdpa.json" > "$R/bench_sdpa.log" 2>&1
tail -32 "$R/bench_sdpa.log" | cut -c1-190
timeout ${DSA_S:-130} python3 -m benchmarks.dsa --quick --budget-s ${DSA_BUDGET:-95} \
    --skip hole_sweep,backward_memory,torch_gather_baseline --out "$R/bench_dsa.json" > "$R/bench_dsa.log" 2>&1
tail -16 "$R/bench_dsa.log" | cut -c1-220
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
