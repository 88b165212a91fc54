#!/usr/bin/env bash
# Session 7's final H200 check (~9 minutes) of this tree:
#   1. host overhead per call (fast vs torch) and benchmarks.sdpa's fp32 rows, alone on the GPU;
#   2. in parallel: the complete conformance suite on fast under the gpu profile (bf16
#      included; BUDGET seconds, default 380), and fast's launch tests in check mode then the
#      SDPA / DSA smoke and reliability tests (4 workers).
# Usage (device, repository root): OUT=dir [BUDGET=s] bash benchmarks/h200_s7_final.sh;
# everything lands in $OUT/final.tgz plus $OUT/summary.txt.
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 40 python3 -m benchmarks.overhead --areas sdpa,dsa --out "$W/overhead.json" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; grep -v ":issue\|_part_" "$W/overhead.log" | tail -16
timeout 150 python3 -m benchmarks.sdpa --lengths none --no-rank3 --no-memory \
    --out "$W/sdpa_fp32.json" > "$W/sdpa_fp32.log" 2>&1
note "sdpa fp32: exit $?"; tail -4 "$W/sdpa_fp32.log"
(OUT=$W BUDGET=${BUDGET:-380} WORKERS=12 bash .ci/gpu fast --impl fast > "$W/conformance_summary.log" 2>&1) &
SDPA_AUTOTUNE=0 ATTENTION_ORACLE_FAST_LAUNCH=check timeout 60 python3 -m pytest -p no:cacheprovider \
    -q -n 4 -rfE meta_tests/test_fast_launch.py > "$W/launch.log" 2>&1
note "launch tests (check mode): exit $?"; grep -E "passed|failed|FAILED|ERROR" "$W/launch.log" | cut -c1-200 | tail -6
timeout 200 python3 -m pytest -p no:cacheprovider -q -n 4 -rfE --tb=line meta_tests/test_fast_sdpa_smoke.py \
    meta_tests/test_fast_dsa_smoke.py meta_tests/test_fast_reliability.py meta_tests/test_fast_multi_device.py \
    > "$W/smoke.log" 2>&1
note "smoke: exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke.log" | cut -c1-300 | tail -12
wait
note "gpu conformance fast"; tail -70 "$W/conformance_summary.log"
} 2>&1 | tee "$W/summary.txt"
finish final
