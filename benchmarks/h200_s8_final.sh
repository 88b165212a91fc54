#!/usr/bin/env bash
# Session 8's final H200 check of this tree (~11 minutes with the default budget):
#   1. host overhead per call, fast and torch timed in turn (benchmarks.overhead --pairs), alone;
#   2. in parallel: the complete conformance suite on fast under the gpu profile (bf16
#      included; BUDGET seconds, default 540, enough for the full-size DSA fixtures that wait
#      for the device alone), and fast's launch tests in check mode, then the SDPA / DSA smoke,
#      reliability, Gluon and multi-device tests (4 workers);
#   3. with SWEEP=1, after those: benchmarks.sdpa's bf16 sweep (L 1k, 4k, 16k; D 64 and 128);
#      with DSA=1: benchmarks.dsa --quick.
# Usage (device, repository root): OUT=dir [BUDGET=s] [SWEEP=1] [DSA=1] bash benchmarks/h200_s8_final.sh;
# everything lands in $OUT/final.tgz plus $OUT/summary.txt.
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 90 python3 -m benchmarks.overhead --areas sdpa,dsa --pairs 15 --out "$W/overhead.json" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; grep -v ":issue" "$W/overhead.log" | tail -30
(OUT=$W BUDGET=${BUDGET:-540} WORKERS=12 bash .ci/gpu fast --impl fast > "$W/conformance_summary.log" 2>&1) &
SDPA_AUTOTUNE=0 ATTENTION_ORACLE_FAST_LAUNCH=check timeout 90 python3 -m pytest -p no:cacheprovider \
    -q -n 4 -rfE meta_tests/test_fast_launch.py > "$W/launch.log" 2>&1
note "launch tests (check mode): exit $?"; grep -E "passed|failed|FAILED|ERROR" "$W/launch.log" | cut -c1-200 | tail -6
smoke=(meta_tests/test_fast_sdpa_smoke.py meta_tests/test_fast_dsa_smoke.py meta_tests/test_fast_reliability.py
       meta_tests/test_fast_multi_device.py)
[ -f meta_tests/test_fast_sdpa_gluon.py ] && smoke+=(meta_tests/test_fast_sdpa_gluon.py)
timeout 240 python3 -m pytest -p no:cacheprovider -q -n 4 -rfE --tb=line "${smoke[@]}" > "$W/smoke.log" 2>&1
note "smoke: exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke.log" | cut -c1-300 | tail -12
wait
note "gpu conformance fast"; tail -75 "$W/conformance_summary.log"
if [ "${SWEEP:-0}" = 1 ]; then
    timeout 170 python3 -m benchmarks.sdpa --lengths 4096,16384,1024 --precompile 14 --no-rank3 --no-memory \
        --no-fp32 --budget-s 155 --out "$W/sdpa.json" > "$W/sdpa.log" 2>&1
    note "sdpa: exit $?"; tail -45 "$W/sdpa.log"
fi
if [ "${DSA:-0}" = 1 ]; then
    timeout 150 python3 -m benchmarks.dsa --quick --budget-s 135 --skip hole_sweep,backward_memory,torch_gather_baseline \
        --out "$W/dsa.json" > "$W/dsa.log" 2>&1
    note "dsa: exit $?"; tail -40 "$W/dsa.log"
fi
} 2>&1 | tee "$W/summary.txt"
finish final
