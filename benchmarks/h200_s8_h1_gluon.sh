#!/usr/bin/env bash
# Session 8, helper H1: the Gluon SDPA forward on the H200 (~5 minutes; the first call ran the
# four synchronous configs in 109 s):
#   1. host us per call at L 128; bf16 L 4k (B 4, H 32, D 128), causal and not: cuDNN,
#      fast-triton and fast-gluon in four configs (BLOCK_M, BLOCK_N, STAGES, num_warps[, WS]),
#      both timing methods, with max|gluon - triton| and the error against float64 on one head;
#   2. the GPU-only agreement tests of the Gluon forward (meta_tests/test_fast_sdpa_gluon.py);
#   3. L 1k (B 16) and 16k (B 1) for two configs.
# Usage (device, repository root): OUT=dir bash benchmarks/h200_s8_h1_gluon.sh
source "$(dirname "$0")/h200_common.sh"
{
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 120 python3 -m benchmarks.sdpa_gluon --configs 128,128,2,8 64,64,2,4 128,128,2,4,1 128,64,3,4,1 \
    --shapes 1 --json "$W/l4k.json" > "$W/l4k.log" 2>&1
note "L 4k: exit $?"; grep -v "^{" "$W/l4k.log" | tail -13
ATTENTION_ORACLE_GLUON_VARIANTS=1 SDPA_AUTOTUNE=0 timeout 170 python3 -m pytest -p no:cacheprovider -q -x -n 0 -rfE --tb=short \
    meta_tests/test_fast_sdpa_gluon.py > "$W/test.log" 2>&1
note "gluon tests: exit $?"; tail -25 "$W/test.log" | cut -c1-400
timeout 100 python3 -m benchmarks.sdpa_gluon --configs 128,128,2,8 128,128,2,4,1 --shapes 0,2 \
    --json "$W/l1k16k.json" > "$W/l1k16k.log" 2>&1
note "L 1k, 16k: exit $?"; grep -v "^{" "$W/l1k16k.log" | tail -10
} 2>&1 | tee "$W/summary.txt"
finish h1_gluon
