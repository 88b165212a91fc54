#!/usr/bin/env bash
# Session 8: the Gluon forward with the warp-specialized config as its default: its GPU tests
# (all configs), the SDPA conformance under ATTENTION_ORACLE_FAST_SDPA_FWD=gluon (gpu profile),
# then L 1k / 16k timings. Usage (device, repository root): OUT=dir bash benchmarks/h200_s8_gluon_ws.sh
source "$(dirname "$0")/h200_common.sh"
{
(ATTENTION_ORACLE_FAST_SDPA_FWD=gluon OUT=$W BUDGET=175 WORKERS=10 bash .ci/gpu gluon_sdpa attention_oracle/conformance/test_sdpa.py attention_oracle/conformance/test_regressions.py --impl fast > "$W/conf_gluon_summary.log" 2>&1) &
ATTENTION_ORACLE_GLUON_VARIANTS=1 timeout 170 python3 -m pytest -p no:cacheprovider -q -n 3 -rfE --tb=short meta_tests/test_fast_sdpa_gluon.py > "$W/gluon_tests.log" 2>&1
note "gluon tests (WS default, variants on): exit $?"; tail -15 "$W/gluon_tests.log" | cut -c1-300
wait
note "conformance sdpa under gluon"; tail -30 "$W/conf_gluon_summary.log"
timeout 80 python3 -m benchmarks.sdpa_gluon --configs 128,128,2,4,1 128,128,2,8 --shapes 0,2 --json "$W/gluon_ws_1k16k.json" > "$W/gluon_ws_1k16k.log" 2>&1
note "gluon 1k/16k: exit $?"; grep -v "^{" "$W/gluon_ws_1k16k.log" | tail -12
} 2>&1 | tee "$W/summary.txt"
finish gluon
