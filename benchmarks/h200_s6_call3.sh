#!/usr/bin/env bash
# session 6, call 3: forward variants with warp specialization; host overhead with one autograd node
set -uo pipefail
W=$(mktemp -d); export PYTHONUNBUFFERED=1; t0=$(date +%s)
note() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
{
for i in 1 2; do
timeout 60 python3 -m benchmarks.overhead --areas sdpa --out "$W/overhead$i.json" > "$W/overhead$i.log" 2>&1
note "overhead run $i: exit $?"; grep -v ":issue" "$W/overhead$i.log"
done
timeout 300 python3 -m benchmarks.sdpa_fwd_tune --dims 128,64 --lengths 4096 --variants fold,fold+ws,fold+tma+ws --out "$W/fwd_tune.json" > "$W/fwd_tune.log" 2> "$W/fwd_tune.err"
note "fwd tune: exit $?"; cat "$W/fwd_tune.log"; grep -v "^\s*$" "$W/fwd_tune.err" | cut -c1-300 | sort | uniq -c | sort -rn | head -12
} 2>&1 | tee "$W/summary.txt"
mkdir -p "$OUT"; cp "$W/summary.txt" "$OUT/summary.txt"; tar czf "$OUT/call3.tgz" -C "$W" .
