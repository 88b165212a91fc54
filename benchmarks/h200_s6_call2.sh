#!/usr/bin/env bash
# session 6, call 2: where fast SDPA's fwd+bwd host time goes (benchmarks.overhead parts), twice
set -uo pipefail
W=$(mktemp -d); export PYTHONUNBUFFERED=1
{
for i in 1 2; do
timeout 90 python3 -m benchmarks.overhead --areas sdpa --out "$W/overhead$i.json" \
    $([ $i = 1 ] && echo --profile "$W/overhead_profile.txt") > "$W/overhead$i.log" 2>&1
echo "== overhead run $i: exit $?"; cat "$W/overhead$i.log"
done
} 2>&1 | tee "$W/summary.txt"
mkdir -p "$OUT"; cp "$W/summary.txt" "$OUT/summary.txt"; tar czf "$OUT/call2.tgz" -C "$W" .
