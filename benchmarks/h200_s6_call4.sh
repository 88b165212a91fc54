#!/usr/bin/env bash
# session 6, call 4: host overhead after the call plans (benchmarks.overhead twice, host_threads)
set -uo pipefail
W=$(mktemp -d); export PYTHONUNBUFFERED=1
{
for i in 1 2; do
timeout 60 python3 -m benchmarks.overhead --areas sdpa,dsa --out "$W/overhead$i.json" \
    $([ $i = 1 ] && echo --profile "$W/overhead_profile.txt") > "$W/overhead$i.log" 2>&1
echo "== overhead run $i: exit $?"; grep -v ":issue" "$W/overhead$i.log"
done
timeout 90 python3 -m benchmarks.host_threads --out "$W/host_threads.json" > "$W/host_threads.log" 2>&1
echo "== host_threads: exit $?"; grep stack "$W/host_threads.log"
} 2>&1 | tee "$W/summary.txt"
mkdir -p "$OUT"; cp "$W/summary.txt" "$OUT/summary.txt"; tar czf "$OUT/call4.tgz" -C "$W" .
