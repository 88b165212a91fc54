#!/usr/bin/env bash
# Session 7, call 2 (~8 minutes): fast SDPA's fp32 "tf32x3" mode on the H200.
#   1. the native smoke tests that run tf32x3 (finfo.min rows, a mode change between forward and backward);
#   2. benchmarks.sdpa's fp32 rows for every fp32 mode against torch's fp32 default (both timing
#      methods), no bf16 sweep;
#   3. in parallel: the gpu-profile conformance of fast SDPA (+ SDPA regressions) with
#      ATTENTION_ORACLE_FAST_FP32=tf32x3, and the fp32 calibration of fast (tf32x3) and torch.
# Usage (device, repository root): OUT=dir bash benchmarks/h200_s7_call2.sh
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 90 python3 -m pytest -p no:cacheprovider -q -n 6 -rfE --tb=short meta_tests/test_fast_sdpa_smoke.py \
    -k "tf32x3 or mode_change" > "$W/smoke.log" 2>&1
note "smoke (tf32x3): exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke.log" | cut -c1-300 | tail -12
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
finish call2
