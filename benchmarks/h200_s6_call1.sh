#!/usr/bin/env bash
# session 6, call 1: forward variants, host-overhead parts, native smoke with fold (and tma)
set -uo pipefail
W=$(mktemp -d); export PYTHONUNBUFFERED=1; t0=$(date +%s)
note() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 100 python3 -m pytest -p no:cacheprovider -q -n 14 -x -rfE meta_tests/test_fast_sdpa_smoke.py > "$W/smoke_fold.log" 2>&1
note "smoke (fold default): exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke_fold.log" | cut -c1-300 | tail -8
timeout 60 python3 -m benchmarks.overhead --areas sdpa --launch-modes direct --out "$W/overhead.json" --profile "$W/overhead_profile.txt" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; cat "$W/overhead.log" | tail -20
timeout 240 python3 -m benchmarks.sdpa_fwd_tune --dims 64,128 --lengths 4096 --out "$W/fwd_tune.json" > "$W/fwd_tune.log" 2> "$W/fwd_tune.err"
note "fwd tune: exit $?"; cat "$W/fwd_tune.log"; sort "$W/fwd_tune.err" | uniq -c | sort -rn | head -8 | cut -c1-400
ATTENTION_ORACLE_FAST_TMA=1 timeout 90 python3 -m pytest -p no:cacheprovider -q -n 14 -rfE meta_tests/test_fast_sdpa_smoke.py > "$W/smoke_tma.log" 2>&1
note "smoke (tma on): exit $?"; grep -E "passed|failed|FAILED|ERROR|Error" "$W/smoke_tma.log" | cut -c1-300 | tail -8
} 2>&1 | tee "$W/summary.txt"
mkdir -p "$OUT"; cp "$W/summary.txt" "$OUT/summary.txt"; tar czf "$OUT/call1.tgz" -C "$W" .
