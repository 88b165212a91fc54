#!/usr/bin/env bash
# Session 8's final H200 verification of this tree (~9.5 minutes, one device call):
#   in parallel, the complete conformance suite on fast under the gpu profile (bf16 included;
#   BUDGET seconds, default 500: enough for the full-size DSA fixtures, which wait for the
#   device alone until the other workers' GPU tests are done), and fast's launch tests in check
#   mode, then the SDPA / DSA smoke, reliability, Gluon and multi-device tests (4 workers).
# The benchmarks of the same tree are benchmarks/h200_s8_bench.sh (a second call: one call may
# run 600 s).
# Usage (device, repository root): OUT=dir [BUDGET=s] bash benchmarks/h200_s8_final.sh;
# everything lands in $OUT/final.tgz plus $OUT/summary.txt.
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
(OUT=$W BUDGET=${BUDGET:-500} WORKERS=12 bash .ci/gpu fast --impl fast > "$W/conformance_summary.log" 2>&1) &
SDPA_AUTOTUNE=0 ATTENTION_ORACLE_FAST_LAUNCH=check timeout 90 python3 -m pytest -p no:cacheprovider \
    -q -n 4 -rfE meta_tests/test_fast_launch.py > "$W/launch.log" 2>&1
note "launch tests (check mode): exit $?"; grep -E "passed|failed|FAILED|ERROR" "$W/launch.log" | cut -c1-200 | tail -6
smoke=(meta_tests/test_fast_sdpa_smoke.py meta_tests/test_fast_dsa_smoke.py meta_tests/test_fast_reliability.py
       meta_tests/test_fast_multi_device.py meta_tests/test_fast_sdpa_gluon.py)
timeout 380 python3 -m pytest -p no:cacheprovider -q -n 4 -rfE --tb=line "${smoke[@]}" > "$W/smoke.log" 2>&1
note "smoke: exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke.log" | cut -c1-300 | tail -12
wait
note "gpu conformance fast"; tail -75 "$W/conformance_summary.log"
} 2>&1 | tee "$W/summary.txt"
finish final
