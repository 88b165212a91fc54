#!/usr/bin/env bash
# One H200 call (~8 minutes) that checks this tree natively after the session-5 changes:
#   1. fast's launch tests in check mode (every direct launch verified against Triton's), then
#      fast's smoke and reliability tests;
#   2. host overhead per call, direct and Triton launches side by side;
#   3. the conformance suite on fast under the gpu profile (bf16 included), cut by its budget;
#   4. the negative controls that raised device errors on CUDA before their fix;
#   5. SDPA at L 4096 (D 64 and 128, causal and not) and DSA --quick (NoPE rows and index
#      preparation included) with both timing methods;
#   6. benchmarks.compare fast vs torch.
# Usage (device, repository root): OUT=dir bash benchmarks/h200_final.sh; everything lands in
# $OUT/final.tgz plus $OUT/summary.txt.
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
SDPA_AUTOTUNE=0 ATTENTION_ORACLE_FAST_LAUNCH=check timeout 60 python3 -m pytest -p no:cacheprovider \
    -q -n 8 -rfE meta_tests/test_fast_launch.py > "$W/launch.log" 2>&1
note "launch tests (check mode): exit $?"; grep -E "passed|failed|FAILED|ERROR" "$W/launch.log" | cut -c1-200 | tail -8
timeout 90 python3 -m pytest -p no:cacheprovider -q -n 14 -rfE meta_tests/test_fast_sdpa_smoke.py \
    meta_tests/test_fast_dsa_smoke.py meta_tests/test_fast_reliability.py > "$W/smoke.log" 2>&1
note "smoke: exit $?"; grep -E "passed|failed|FAILED|ERROR" "$W/smoke.log" | cut -c1-200 | tail -12
timeout 45 python3 -m benchmarks.overhead --areas sdpa,dsa --launch-modes direct,triton \
    --out "$W/overhead.json" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; tail -25 "$W/overhead.log"
OUT=$W BUDGET=120 WORKERS=14 bash .ci/gpu fast --impl fast
note "gpu conformance fast"
timeout 50 python3 -m attention_oracle calibrate --impl controls --area dsa,index --device cuda \
    --control DocumentLeak,GradientsForInvalidSlots,CausalOffByOne,LengthsCountValidSlots,UnstableCompaction \
    --control-examples 20 --budget-s 40 --no-png --out "$W/cal-controls" > "$W/controls.log" 2>&1
note "controls: exit $?"; sed -n '/^Negative controls/,/^Cut/p' "$W/cal-controls/calibration.txt" | head -30
timeout 55 python3 -m benchmarks.sdpa --lengths 4096 --precompile 14 --no-rank3 --no-memory \
    --no-fp32 --budget-s 45 --out "$W/sdpa.json" > "$W/sdpa.log" 2>&1
note "sdpa: exit $?"; tail -30 "$W/sdpa.log"
timeout 55 python3 -m benchmarks.dsa --quick --budget-s 40 \
    --skip hole_sweep,backward_memory,torch_gather_baseline --out "$W/dsa.json" > "$W/dsa.log" 2>&1
note "dsa: exit $?"; tail -45 "$W/dsa.log"
timeout 45 python3 -m benchmarks.compare --impl fast --impl torch --lengths 1024,4096 --reps 5 \
    --areas sdpa --out "$W/compare.json" > "$W/compare.log" 2>&1
note "compare: exit $?"; tail -20 "$W/compare.log"
} 2>&1 | tee "$W/summary.txt"
finish final
