#!/usr/bin/env bash
# Session 8, helper H2: fast DSA bf16 tuning on the H200 in one call (NOTES.md, "fast DSA tuning,
# session 8"). The sm_90a compile report of the kernels on the device's Triton (registers, spills,
# wgmma serialisation C7515, loop instruction counts), then benchmarks.dsa_tune over the
# candidates in $ONLY (both problems, both timing methods, diff and float64 error of each), then
# the DSA smoke tests natively under the tree's defaults. Everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
R=${OUT:-out}
mkdir -p "$R"
# the first call ran ONLY=s7_default,nzt64_s2,nzt64_s3_i32,nzt32_s2_i32,nzt32_s3_i32,k64_i32,k64_tm,
# k64_ro,k64_i32_tm_ro (old defaults then); the default now: the follow-up (old defaults beside
# the new ones, even_d, int32_rows + rope_owner without token_major), whose smoke run covers the
# new backward default natively
ONLY=${ONLY:-s7_default,nzt64_s2_i32_ed,halves_k64_s1,k64_i32_ro,k64_i32_tm_ro_ed}
t0=$(date +%s)
stamp() { echo "$1 rc $2 after $(( $(date +%s) - t0 )) s" >> "$R/times.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/gpu.txt" 2>&1
( timeout 150 python3 -m attention_oracle.fast.kernels.dsa_probe fwd --sass 64,64,512,512,8,2,0,1 \
      64,64,512,512,8,2,0,1+no_zero_trip+int32_rows
  timeout 150 python3 -m attention_oracle.fast.kernels.dsa_probe bwd --sass 64,64,64,256,8,1,1,1,1 \
      64,64,64,256,8,1,1,1,1+int32_rows ) > "$R/probe.txt" 2>&1 &
timeout ${TUNE_S:-300} python3 -m benchmarks.dsa_tune --jobs 14 --only "$ONLY" --out "$R/dsa_tune.json" \
    > "$R/dsa_tune.log" 2>&1
stamp tune $?
wait
timeout ${SMOKE_S:-150} python3 -m pytest -p no:cacheprovider -q -n 12 meta_tests/test_fast_dsa_smoke.py \
    > "$R/smoke.log" 2>&1
stamp smoke $?
cat "$R/gpu.txt" "$R/times.txt"
cut -c1-330 "$R/probe.txt"
sed -n '/^doc_16384 (T/,$p' "$R/dsa_tune.log" | cut -c1-150
tail -3 "$R/smoke.log"
