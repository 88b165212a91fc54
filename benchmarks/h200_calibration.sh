#!/usr/bin/env bash
# One device call (~6 minutes) of calibration on the H200, every step within its own budget:
#   1. the negative controls' calibration table on CUDA, fp32/fp16/bf16 (gpu-profile sizes);
#   2. the correct built-ins' table: oracle and PyTorch's backends (torch-flex apart, step 3);
#   3. F7/F8 re-judged: benchmarks.rule_calibration --device cuda --dtypes float32, both rules on
#      the same cases, torch-flex capped to a few shapes (it compiles per shape) plus F8's shapes;
#   4. the narrow real kernel: PyTorch's FLASH_ATTENTION backend alone with its capability
#      declaration (properties/adapters/torch_flash_narrow.py) under the gpu profile, and the
#      refused vs judged counts from its report;
#   5. fast natively at small sizes (a few examples per group: it autotunes per shape).
# Each step's budget counts from its process' start (drawing the cases included); an example in
# flight runs to its end, and `timeout` sends SIGTERM GRACE seconds after the budget, on which
# the tools stop and still print (and write) what they collected. Tables are rewritten after
# every round (calibration.txt / .json), so even a killed step leaves its partial table.
#
# Usage (device machine, repository root):  OUT=/path bash benchmarks/h200_calibration.sh
# Knobs (environment): PY (python3), DEVICE (cuda), GRACE (30), B_CONTROLS B_TORCH B_RULE
# B_NARROW B_FAST (budgets in s: 120 60 80 60 40), SIZES (large), NARROW_PROFILE (gpu),
# EXAMPLES CONTROL_EXAMPLES FAST_EXAMPLES (10 40 4), STEPS (which steps: "1 2 3 4 5").
# CPU check of the logic with tiny budgets:
#   OUT=/tmp/h200 DEVICE=cpu SIZES=small NARROW_PROFILE=dev GRACE=10 B_CONTROLS=15 B_TORCH=15 \
#     B_RULE=20 B_NARROW=40 B_FAST=15 bash benchmarks/h200_calibration.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/h200}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
GRACE=${GRACE:-30}
SIZES=${SIZES:-large}
NARROW_PROFILE=${NARROW_PROFILE:-gpu}
STEPS=${STEPS:-1 2 3 4 5}
B_CONTROLS=${B_CONTROLS:-120}; B_TORCH=${B_TORCH:-60}; B_RULE=${B_RULE:-80}
B_NARROW=${B_NARROW:-60}; B_FAST=${B_FAST:-40}
EXAMPLES=${EXAMPLES:-10}; CONTROL_EXAMPLES=${CONTROL_EXAMPLES:-40}; FAST_EXAMPLES=${FAST_EXAMPLES:-4}
NARROW=attention_oracle.properties.adapters.torch_flash_narrow:NarrowFlash
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
t0=$(date +%s)

# step NAME BUDGET SIGNAL CMD...: run CMD with a hard limit of BUDGET + GRACE, log to $OUT/NAME.log
step() {
    local name=$1 budget=$2 sig=$3 start rc
    shift 3
    start=$(date +%s)
    timeout -s "$sig" -k 15 $((budget + GRACE)) "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(($(date +%s) - start)) s (budget $budget s, $(($(date +%s) - t0)) s in all; log $OUT/$name.log)"
}

# the calibration tables of DIR: correct implementations whole, controls only where not ok
show_tables() {
    local txt=$1/calibration.txt
    if [ ! -s "$txt" ]; then echo "   (no table written: see the log)"; return; fi
    head -1 "$txt"
    awk '/^Correct implementations/{p=1} /^Negative controls/{p=0} p' "$txt"
    awk '/^Known failure classes/{p=1} /^Negative controls/{p=0} p' "$txt" | head -12
    awk '/^Negative controls/{p=1} /^Cut|^Not run/{p=0} p' "$txt" > "$OUT/.controls"
    local rows ok
    rows=$(tail -n +4 "$OUT/.controls" | grep -c .)
    if [ "$rows" -gt 0 ]; then
        ok=$(tail -n +4 "$OUT/.controls" | grep -c ' ok$')
        head -3 "$OUT/.controls"
        echo "  ($ok of $rows rows ok; the others:)"
        tail -n +4 "$OUT/.controls" | grep -v ' ok$' | grep . | head -60
    fi
    grep -A4 "^Cut" "$txt" | head -5
}

case " $STEPS " in *" 1 "*)
    step calibrate-controls "$B_CONTROLS" TERM \
        "$PY" -m attention_oracle calibrate --impl controls --device "$DEVICE" --sizes "$SIZES" \
        --control-examples "$CONTROL_EXAMPLES" --budget-s "$B_CONTROLS" --out "$OUT/cal-controls"
    show_tables "$OUT/cal-controls";;
esac

case " $STEPS " in *" 2 "*)
    step calibrate-torch "$B_TORCH" TERM \
        "$PY" -m attention_oracle calibrate --impl oracle,torch,torch-math,torch-flash,torch-efficient,torch-cudnn \
        --device "$DEVICE" --sizes "$SIZES" --examples "$EXAMPLES" --budget-s "$B_TORCH" --out "$OUT/cal-torch"
    show_tables "$OUT/cal-torch";;
esac

case " $STEPS " in *" 3 "*)
    step rule-calibration "$B_RULE" TERM \
        "$PY" -m benchmarks.rule_calibration --device "$DEVICE" --dtypes float32 --no-floor --f8 \
        --impl torch,torch-efficient,torch-cudnn,torch-flex --examples 6 --examples-for torch-flex=2 \
        --budget-s "$B_RULE" --json "$OUT/rule_calibration.json"
    grep -E "^(sdpa|dsa) |^rule_calibration:" "$OUT/rule-calibration.log" | cut -c1-200;;
esac

case " $STEPS " in *" 4 "*)
    # pytest writes its report when interrupted (SIGINT), as .ci/gpu relies on
    step narrow-flash "$B_NARROW" INT \
        "$PY" -m attention_oracle check --impl "$NARROW" -p no:cacheprovider \
        --hypothesis-profile "$NARROW_PROFILE" --oracle-report "$OUT/narrow.json" -q -rfE
    grep -E "^FAILED|^ERROR|passed|failed|^not verified|report written" "$OUT/narrow-flash.log" | cut -c1-300 | tail -20
    "$PY" - "$OUT/narrow.json" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, ValueError, KeyError) as exc:
    sys.exit(f"narrow: no report ({exc})")
drawn = refused = 0
print(f"narrow: {'check':32} {'drawn':>6} {'refused':>8} {'judged':>7}  pass fail unsup skip")
for r in rows:
    if r["examples"] == 0 and not (r["passed"] or r["failed"]):
        continue
    drawn, refused = drawn + r["examples"], refused + r["refused"]
    print(f"narrow: {r['check']:32} {r['examples']:6} {r['refused']:8} {r['examples'] - r['refused']:7}"
          f"  {r['passed']:4} {r['failed']:4} {r['unsupported']:5} {r['skipped']:4}")
share = f"{refused / drawn:.0%}" if drawn else "-"
print(f"narrow: in all {drawn} examples drawn, {refused} refused ({share}), {drawn - refused} judged")
EOF
    ;;
esac

case " $STEPS " in *" 5 "*)
    step calibrate-fast "$B_FAST" TERM \
        "$PY" -m attention_oracle calibrate --impl fast --device "$DEVICE" --sizes small \
        --examples "$FAST_EXAMPLES" --budget-s "$B_FAST" --out "$OUT/cal-fast"
    show_tables "$OUT/cal-fast";;
esac

echo "h200_calibration: done after $(($(date +%s) - t0)) s; tables under $OUT/cal-*/calibration.txt, logs $OUT/*.log"
