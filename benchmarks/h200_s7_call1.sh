#!/usr/bin/env bash
# Session 7, call 1 (~8 minutes): fast SDPA's fp32 "tf32x3" mode on the H200.
#   1. benchmarks.fp32_first_call_check (session 6's open observation: max_diff 0.0);
#   2. benchmarks.sdpa's fp32 rows for every fp32 mode against torch's fp32 default (both timing
#      methods), no bf16 sweep;
#   3. in parallel: the gpu-profile conformance of fast SDPA (+ SDPA regressions) with
#      ATTENTION_ORACLE_FAST_FP32=tf32x3, and the fp32 calibration of fast (tf32x3) and torch.
# Usage (device, repository root): OUT=dir bash benchmarks/h200_s7_call1.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
W=$(mktemp -d)
export PYTHONUNBUFFERED=1
t0=$(date +%s)
note() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 60 python3 -m benchmarks.fp32_first_call_check > "$W/first_call.log" 2>&1
note "fp32 first call: exit $?"; tail -5 "$W/first_call.log"
timeout 230 python3 -m benchmarks.sdpa --lengths none --no-rank3 --no-memory \
    --out "$W/sdpa_fp32.json" > "$W/sdpa_fp32.log" 2>&1
note "sdpa fp32: exit $?"; tail -8 "$W/sdpa_fp32.log"
(ATTENTION_ORACLE_FAST_FP32=tf32x3 OUT=$W BUDGET=150 WORKERS=10 bash .ci/gpu sdpa_tf32x3 \
    attention_oracle/conformance/test_sdpa.py attention_oracle/conformance/test_regressions.py \
    --impl fast -k sdpa > "$W/conf_summary.log" 2>&1) &
ATTENTION_ORACLE_FAST_FP32=tf32x3 timeout 150 python3 -m attention_oracle calibrate --impl fast,torch \
    --area sdpa --dtypes float32 --device cuda --examples 8 --budget-s 110 --no-png \
    --out "$W/cal" > "$W/cal.log" 2>&1
note "calibration: exit $?"; tail -40 "$W/cal.log"
wait
note "conformance (tf32x3)"; tail -60 "$W/conf_summary.log"
} 2>&1 | tee "$W/summary.txt"
mkdir -p "$OUT"
cp "$W/summary.txt" "$OUT/summary.txt"
tar czf "$OUT/call1.tgz" -C "$W" .
