#!/usr/bin/env bash
# A short H200 batch: fast's smoke + reliability tests natively, the host overhead per call and
# one SDPA point, the DSA host overhead and PDL sections. Usage: OUT=dir bash benchmarks/h200_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
timeout "${SMOKE_S:-110}" python3 -m pytest -p no:cacheprovider -q -n 12 -rfE \
    meta_tests/test_fast_sdpa_smoke.py meta_tests/test_fast_dsa_smoke.py meta_tests/test_fast_reliability.py \
    > "$OUT/smoke.log" 2>&1
echo "smoke exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/smoke.log" | cut -c1-200 | tail -15
timeout "${SDPA_S:-80}" python3 -m benchmarks.sdpa --lengths 4096 --dims 128 --causal 0 --no-rank3 \
    --no-memory --no-fp32 --precompile 8 --out "$OUT/sdpa_check.json" 2>&1 | tail -8
timeout "${DSA_S:-70}" python3 -m benchmarks.dsa --quick --budget-s 50 --skip fast,nope_rows,hole_sweep,backward_memory,torch_gather_baseline --out "$OUT/dsa_check.json" 2>&1 | tail -12
