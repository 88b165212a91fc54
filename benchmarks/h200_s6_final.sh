#!/usr/bin/env bash
# Session 6's final H200 check (~7 minutes) of this tree:
#   1. fast's launch tests in check mode, then fast's SDPA / DSA smoke and reliability tests;
#   2. host overhead per call (fast vs torch, the call plans);
#   3. the conformance suite on fast under the gpu profile (bf16 included), cut by its budget;
#   4. SDPA at L 1024, 4096 and 16384 (D 64 and 128, causal and not; fast, cuDNN, FA2; both
#      timing methods) and the fp32 rows.
# Usage (device, repository root): OUT=dir bash benchmarks/h200_s6_final.sh; everything lands in
# $OUT/final.tgz plus $OUT/summary.txt.
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
SDPA_AUTOTUNE=0 ATTENTION_ORACLE_FAST_LAUNCH=check timeout 50 python3 -m pytest -p no:cacheprovider \
    -q -n 8 -rfE meta_tests/test_fast_launch.py > "$W/launch.log" 2>&1
note "launch tests (check mode): exit $?"; grep -E "passed|failed|FAILED|ERROR" "$W/launch.log" | cut -c1-200 | tail -6
timeout 100 python3 -m pytest -p no:cacheprovider -q -n 14 -rfE --tb=line meta_tests/test_fast_sdpa_smoke.py \
    meta_tests/test_fast_dsa_smoke.py meta_tests/test_fast_reliability.py > "$W/smoke.log" 2>&1
note "smoke: exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke.log" | cut -c1-300 | tail -12
timeout 40 python3 -m benchmarks.overhead --areas sdpa,dsa --out "$W/overhead.json" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; grep -v ":issue\|_part_" "$W/overhead.log" | tail -16
OUT=$W BUDGET=110 WORKERS=14 bash .ci/gpu fast --impl fast
note "gpu conformance fast"
timeout 150 python3 -m benchmarks.sdpa --lengths 4096,16384,1024 --precompile 14 --no-rank3 --no-memory \
    --no-fp32 --budget-s 135 --out "$W/sdpa.json" > "$W/sdpa.log" 2>&1
note "sdpa: exit $?"; tail -45 "$W/sdpa.log"
} 2>&1 | tee "$W/summary.txt"
finish final
