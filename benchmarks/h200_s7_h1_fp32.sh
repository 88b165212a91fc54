#!/usr/bin/env bash
# Session 7, helper H1: fast DSA fp32 "tf32x3" on the H200 in one call (NOTES.md, "fast DSA fp32
# through 3xTF32"). First the benchmark alone on the GPU (acc64 defaults vs the tf32x3 sweep and
# pairs, doc_4096 and doc_16384, synced and queued), then, side by side, the correctness runs in
# the new mode: the fp32 smoke tests, the gpu-profile conformance of fast DSA and the GPU
# calibration of fast DSA fp32. Everything lands in $OUT/r, tarred to $OUT/r.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
R=${OUT:-out}/r
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/gpu.txt" 2>&1
t0=$(date +%s)
timeout 180 python3 -m benchmarks.dsa --quick --only fp32 --out "$R/bench_fp32.json" > "$R/bench_fp32.log" 2>&1
echo "bench rc $? after $(( $(date +%s) - t0 )) s" >> "$R/times.txt"
export ATTENTION_ORACLE_FAST_DSA_FP32=tf32x3
timeout 150 python3 -m pytest -q -n 4 -p no:cacheprovider -rfE meta_tests/test_fast_dsa_smoke.py \
    -k "float32 or fp32" > "$R/smoke_fp32.log" 2>&1 &
timeout 130 python3 -m attention_oracle calibrate --impl fast --area dsa --dtypes float32 --device cuda \
    --fast-examples 8 --budget-s 90 --no-png --out "$R/cal" > "$R/cal.log" 2>&1 &
OUT="$R" BUDGET=${BUDGET:-150} WORKERS=${WORKERS:-10} bash .ci/gpu dsa_tf32x3 \
    attention_oracle/conformance/test_dsa.py attention_oracle/conformance/test_dsa_fixtures.py --impl fast \
    > "$R/conformance.txt" 2>&1
wait
echo "all done after $(( $(date +%s) - t0 )) s" >> "$R/times.txt"
tar czf "${OUT:-out}/r.tgz" -C "$(dirname "$R")" r
cat "$R/times.txt" "$R/gpu.txt"
grep -E "^fp32 (sweep|doc)" "$R/bench_fp32.log" | cut -c1-160
tail -4 "$R/smoke_fp32.log"; tail -6 "$R/conformance.txt"; grep -A3 "worst ratio per" "$R/cal.log"
