#!/usr/bin/env bash
# Session 8's first H200 call (~4 minutes):
#   1. host overhead, fast and torch timed in turn (benchmarks.overhead --pairs), SDPA only;
#   2. the DSA smoke tests under ATTENTION_ORACLE_FAST_DSA_FP32=tf32x3 (session 7 lost two
#      workers there once, unnamed), verbose so a crashed worker's test is named;
#   3. the full-size DSA fixtures of the conformance suite alone (session 7's budget cut three).
# Usage (device, repository root): OUT=dir bash benchmarks/h200_s8_call1.sh
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 90 python3 -m benchmarks.overhead --areas sdpa --pairs 15 --out "$W/overhead.json" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; grep -v ":issue" "$W/overhead.log" | tail -24
(OUT=$W BUDGET=170 WORKERS=4 bash .ci/gpu fullsize attention_oracle/conformance/test_dsa_fixtures.py \
    -k full_size --impl fast > "$W/fullsize_summary.log" 2>&1) &
ATTENTION_ORACLE_FAST_DSA_FP32=tf32x3 timeout 170 python3 -m pytest -p no:cacheprovider -v -n 6 -rfE \
    --tb=short meta_tests/test_fast_dsa_smoke.py > "$W/dsa_tf32x3_smoke.log" 2>&1
note "dsa smoke under tf32x3: exit $?"
grep -E "crash|node down|replacing|FAILED|ERROR|passed|failed" "$W/dsa_tf32x3_smoke.log" | cut -c1-300 | tail -20
wait
note "full-size fixtures"; tail -30 "$W/fullsize_summary.log"
} 2>&1 | tee "$W/summary.txt"
finish call1
