#!/usr/bin/env bash
# session 6, call 5: the lazy-rescale forward variant; fp32 variants (accurate, accurate+f64, plain)
set -uo pipefail
W=$(mktemp -d); export PYTHONUNBUFFERED=1; t0=$(date +%s)
note() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
{
SDPA_TUNE_CONFIGS="128,64,8,3;128,128,8,3;128,64,4,3" timeout 200 python3 -m benchmarks.sdpa_fwd_tune \
    --dims 128,64 --lengths 4096 --variants fold,fold+lazy --out "$W/fwd_tune.json" > "$W/fwd_tune.log" 2> "$W/fwd_tune.err"
note "fwd tune: exit $?"; cat "$W/fwd_tune.log"; grep -v "^\s*$" "$W/fwd_tune.err" | cut -c1-300 | sort | uniq -c | sort -rn | head -6
timeout 200 python3 -c "
import json
from benchmarks.sdpa import bench_fp32
rows = bench_fp32(rep=100, synced_reps=10)
json.dump(rows, open('$W/fp32.json', 'w'), indent=1)
for r in rows:
    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
" > "$W/fp32.log" 2>&1
note "fp32: exit $?"; tail -c 3000 "$W/fp32.log"
} 2>&1 | tee "$W/summary.txt"
mkdir -p "$OUT"; cp "$W/summary.txt" "$OUT/summary.txt"; tar czf "$OUT/call5.tgz" -C "$W" .
