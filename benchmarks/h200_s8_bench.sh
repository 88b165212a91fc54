#!/usr/bin/env bash
# Session 8's H200 benchmarks of this tree (~5 minutes, one device call):
#   1. host overhead per call, fast and torch timed in turn (benchmarks.overhead --pairs 15);
#   2. benchmarks.dsa --quick (doc_4096, doc_16384, packed_glm_a; NoPE rows, index preparation,
#      PDL), with the session-8 DSA defaults;
#   3. with GLUON_WS=1: the Gluon forward's warp-specialized config at L 4k beside the default
#      (benchmarks.sdpa_gluon; not run on a GPU before; a hang ends at its timeout).
# Usage (device, repository root): OUT=dir [GLUON_WS=1] bash benchmarks/h200_s8_bench.sh
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 90 python3 -m benchmarks.overhead --areas sdpa,dsa --pairs 15 --out "$W/overhead.json" > "$W/overhead.log" 2>&1
note "overhead: exit $?"; grep -v ":issue" "$W/overhead.log" | tail -30
timeout 170 python3 -m benchmarks.dsa --quick --budget-s 150 --skip hole_sweep,backward_memory,torch_gather_baseline \
    --out "$W/dsa.json" > "$W/dsa.log" 2>&1
note "dsa: exit $?"; tail -45 "$W/dsa.log"
if [ "${GLUON_WS:-0}" = 1 ]; then
    timeout 75 python3 -m benchmarks.sdpa_gluon --configs 128,128,2,8 128,128,2,4,1 --shapes 1 \
        --json "$W/gluon_ws.json" > "$W/gluon_ws.log" 2>&1
    note "gluon ws: exit $?"; grep -v "^{" "$W/gluon_ws.log" | tail -12
fi
} 2>&1 | tee "$W/summary.txt"
finish bench
