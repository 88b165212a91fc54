#!/usr/bin/env bash
# The device runs of the suite and of the fast kernels on an H200 (or any CUDA machine), one
# entry point. Run from anywhere; it works in the repository root.
#
#   [OUT=dir] bash benchmarks/h200.sh TASK [TASK ...]
#
# Tasks (each ends within one 10-minute device call with the default budgets):
#   check        fast's launch tests in check mode (every direct launch compared with Triton's
#                own), then the fast kernels' GPU smoke, reliability, Gluon and multi-device
#                tests natively, then the negative controls on CUDA that once raised device errors
#   conformance  the conformance suite on fast under the gpu profile (bf16 included) through
#                .ci/gpu; BUDGET (500 s) is enough for the full-size DSA fixtures
#   sdpa         benchmarks.sdpa at L 1k/4k/16k, D 64/128 (fast vs cuDNN, FA2, default dispatch;
#                fp32 rows included; each phase in SDPA_ROUNDS (3) alternated rounds, ratios
#                the medians of the ratios within a round), benchmarks.compare fast vs torch;
#                ATOMIC_DQ=1 adds forward+backward under the atomic-dQ mode, SDPA_LENGTHS the
#                lengths
#   gluonfwd     the Gluon forward's tiles: their GPU tests (ATTENTION_ORACLE_GLUON_VARIANTS=1),
#                then benchmarks.sdpa_gluon: the one-block WS tile beside its ping-pong form (D 64, 128),
#                the three-consumer tile and its ping-pong form (D 64), and where its host time goes
#   persistent   the Gluon forward's default config, the persistent program by pairs of query
#                blocks: its GPU tests, benchmarks.sdpa_gluon beside the one-block WS kernel at
#                D 64 and 128 (L 1k, 4k, 16k, causal and not), its host parts, then Nsight
#                Compute on the causal L 1k forward (fast, cuDNN) when ncu is there
#   dsa          benchmarks.dsa --quick (doc_4096, doc_16384, packed_glm_a, NoPE rows, index
#                preparation, PDL), then benchmarks.dsa_gluon (the forward's Triton and Gluon
#                backends side by side); FP32=1 adds the fp32 section, TUNE=a,b,... runs
#                benchmarks.dsa_tune on those candidates first
#   dsabwd       the Gluon DSA backward (the default): its GPU tests (tests/fast/test_fast_dsa_gluon.py
#                -k backward), then benchmarks.dsa_gluon --backward (Triton and Gluon backwards
#                side by side, with their gradient errors), then the conformance DSA checks under it
#   sdpabwd      the opt-in Gluon SDPA backward: its GPU tests (tests/fast/test_fast_sdpa_gluon.py
#                -k backward), then benchmarks.sdpa_gluon_bwd (cuDNN, the Triton and the Gluon
#                backwards side by side; the Gluon one under each of GLUON_BWD_SCHEDULES, default
#                auto,tma_deferred), then the conformance SDPA checks under it (dsabwd's
#                and sdpabwd's conformance runs give each check OPTIN_CHECK_S, 30 s: under the
#                gpu profile's 120 s one check could use the whole BUDGET)
#   gluoncover   what the Gluon SDPA kernels took on untimed, checked: their offline build under
#                this Triton (gluon_probe: masked forms, the deferred dQ schedule), their GPU
#                tests of masks, head dims between and past the tiles, the "tma_deferred"
#                schedule, and (a run of its own) the persistent forward
#   index        index preparation's host path: its GPU tests (kept calls, launches by address,
#                the varlen entry), benchmarks.index_prep --host-parts (where a call's host time
#                goes), then its table against a device copy (the kept call beside the general path)
#   gluontime    the same, timed: benchmarks.sdpa_gluon with the persistent program (the default
#                config) beside the one-block WS kernel (D 128, L 1k, 4k) and each mask kind
#                (D 128 and 96, L 4k), then
#                benchmarks.sdpa_gluon_bwd under auto, tma_deferred and serial (L 4k, 16k)
#   fp32         SDPA fp32 "tf32x3": its GPU tests (every tuned tile forced in turn among them),
#                then benchmarks.sdpa's fp32 rows at L 1k-4k, D 64 and 128, the default dQ mode
#                beside the dQ kernel, with the autotuner's picks (TRITON_PRINT_AUTOTUNING)
#   order        the causal order and D 64's forward stages: the tests of sections and of the
#                three-stage persistent forward (ATTENTION_ORACLE_GLUON_VARIANTS=1), then
#                benchmarks.causal_order (sections 0, 32 and 128 MiB; D 64, 128; L 1k, 4k) and
#                benchmarks.sdpa_gluon at D 64 with two and three stages (L 1k-16k, causal and not)
#   fwdforms     the persistent Gluon forward's variant forms: ping-pong consumers
#                (PERSISTENT_PINGPONG), the causal diagonal's half tile (PERSISTENT_HALF), both: their
#                variant tests, benchmarks.sdpa_gluon beside the default (D 64, 128; FORMS_SHAPES,
#                L 1k and 4k), Nsight Compute on D 64's causal L 1k forward and backward (fast, cuDNN)
#   base         this tree's SDPA forwards against those of BASE (a commit, default HEAD~1, its
#                attention_oracle and benchmarks taken by git archive into $OUT/base/tree):
#                benchmarks.sdpa_gluon (the default config: the Gluon and the Triton forward
#                beside cuDNN) at D BASE_DIMS (64,128), L 1k and 4k, causal (BASE_CAUSAL, 1),
#                each tree in turn BASE_ROUNDS (2) times, each run against cuDNN in its own
#                process; BASE's rows go to logs only (benchmarks.targets reads this tree's);
#                BASE_TREE, a folder with the base's attention_oracle and benchmarks, replaces BASE
#   form         what making a persistent form the forward's default needs, all under
#                ATTENTION_ORACLE_FAST_SDPA_FWD_FORM=$FORM (half, the default since): fast's
#                SDPA Gluon, smoke, edge and backend tests, the conformance SDPA checks with
#                the Gluon forward taking every call it can (FORM_BUDGET, 140 s; OPTIN_CHECK_S,
#                30 s a check), then benchmarks.sdpa_gluon's FORM_CONFIGS (the full and the
#                half diagonal's) beside cuDNN at D 64 and 128, L 1k and 4k, causal and not
#   tunecarry    whether a tile tuned on a few heads is kept for many (docs/FINDINGS.md F95):
#                benchmarks/tune_carry.py on this tree and on BASE's (BASE_TREE or BASE, as
#                base), each first after a call of 2 x 3 heads at L 1000 and then alone, every
#                run on a fresh Triton cache: the B 16 H 32 L 1k D 64 causal forward's and
#                step's TFLOP/s and the tiles each ran
#   tunevar      the Triton backward's tuning run to run (docs/FINDINGS.md F91): TUNE_RUNS (4)
#                runs of benchmarks.sdpa_gluon_bwd at D 64 L 1k causal, each from an empty Triton
#                cache of its own (so each tunes afresh), with the tiles each picked and each
#                backward's ratio to cuDNN
#   bwddefault   what keeps the "auto" SDPA backward (the default) the default: fast's SDPA GPU
#                tests with every backward the Gluon kernel can take given to it
#                (ATTENTION_ORACLE_FAST_SDPA_BWD=gluon), the SDPA conformance checks and the
#                regression corpus under it (BWD_BUDGET, 200 s; BWD_CHECK_S, 40 s a check), then
#                the determinism check under "auto" (judged under torch.use_deterministic_algorithms);
#                about 400-550 s with the default budgets (H100: 400 s, 651 tests in 181 s at -n 8)
#   newbwd       both opt-in Gluon backwards in one call: the backwards' registers and spills
#                under this Triton (gluon_probe), a small case of each backward (90 s each at
#                most), then benchmarks.dsa_gluon --backward and benchmarks.sdpa_gluon_bwd at L 4k
#   prefetch     the Gluon DSA kernels' L2 prefetch of key rows (PREFETCH): its GPU tests, then
#                benchmarks.dsa_gluon forward and --backward with --prefetch 1,2 (0, 1, 2 ahead)
#   slotorder    the DSA slot order (docs/FINDINGS.md F96): benchmarks.dsa_order --backward (the
#                same slots in other orders, fast's settings "backward" and "on", the ordering's
#                launch), then under ATTENTION_ORACLE_FAST_DSA_ORDER=$SLOT_ORDER (on):
#                benchmarks.dsa --quick --only fast, fast's DSA GPU tests (Gluon and smoke) and
#                the conformance DSA fixtures at full size (SLOT_BUDGET, 150 s)
#   orderform    the ordering kernel's forms (fast.dsa.ORDER_FORMS): its GPU tests in each form,
#                benchmarks.dsa_order --only none --forms loop,runs twice (the forms timed in
#                turn on packed_glm_a's rows, checked), then under each of ORDER_FORMS ("runs
#                loop") benchmarks.dsa_order --backward (as given, "backward", "on"), and under
#                the first benchmarks.dsa --quick --only fast
#   orderpair    the forward's and the backward's ordering forms: the ordering GPU tests, then
#                benchmarks.dsa_order --backward --step-forms $PAIRS (loop:loop,runs:loop) in 3
#                alternated rounds on packed_glm_a (as given, "on"), then under the forms of
#                PAIR (runs:loop) benchmarks.dsa --only fast (QUICK=1: --quick) and the
#                conformance DSA fixtures at full size (NO_FIXTURES=1: not)
#   overhead     host time per call: fast and torch timed in turn (--pairs), direct vs Triton
#                launches, and where a Python backward's time goes (benchmarks.host_threads)
#   calibration  the calibration report on CUDA: negative controls, correct built-ins, the rule
#                against the naive-only rule (fp32, flex's F8 shapes), the narrow FLASH_ATTENTION
#                kernel with its capability declaration, fast at small sizes
#   profile      Nsight Compute on one launch of each benchmarks.profile_kernels workload (needs ncu;
#                ONLY=a,b,... those workloads alone, e.g. ONLY=sdpa_bwd_fast,sdpa_bwd_gluon,sdpa_bwd_cudnn)
#   optin        what making an opt-in mode the default needs: the Gluon forward's tests (variant
#                tiles included), then the conformance suite on fast under the Gluon forward
#                (sdpa) and under the atomic-dQ backward (sdpa): OPTIN_BUDGET (140) s each,
#                OPTIN_CHECK_S (30) s per check
#   all          check conformance overhead sdpa dsa calibration, in that order (several calls' worth)
#   id           (alone, anywhere) this tree's commit and the content ID that a device run's
#                "tree ... with changes, content ID" line names when its git data is older
#                than its files (a copied working tree)
#
# Everything is written under $OUT/TASK/ (default ./out, which git ignores): logs, JSON reports,
# $OUT/TASK/summary.txt with the lines that matter; then benchmarks.targets judges the speed
# targets from every benchmark JSON under $OUT ($OUT/targets.txt: one verdict line each, the
# cells in $OUT/targets.json). Nothing is written into the tree.
# Knobs (environment): OUT, PY (python3), BUDGET (conformance seconds), WORKERS (conformance
# xdist workers, 12), IMPLS (conformance implementations, "fast"), FP32, TUNE; the
# calibration budgets B_CONTROLS B_TORCH B_RULE B_NARROW B_FAST (120 60 80 60 40 s), GRACE (30),
# SIZES (large), NARROW_PROFILE (gpu), EXAMPLES CONTROL_EXAMPLES FAST_EXAMPLES (10 40 4), STEPS
# ("1 2 3 4 5"), DEVICE (cuda). The fast kernels' own switches pass through, e.g.
# ATTENTION_ORACLE_FAST_SDPA_FWD=gluon or ATTENTION_ORACLE_FAST_DSA_FP32=tf32x3 bash
# benchmarks/h200.sh conformance.
# A CPU check of the calibration logic with tiny budgets:
#   OUT=/tmp/h200 DEVICE=cpu SIZES=small NARROW_PROFILE=dev GRACE=10 B_CONTROLS=15 B_TORCH=15 \
#     B_RULE=20 B_NARROW=40 B_FAST=15 bash benchmarks/h200.sh calibration
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
export PYTHONUNBUFFERED=1
TESTS=tests/fast  # the fast kernels' own tests
NARROW=${NARROW:-attention_oracle.judge.adapters.torch_flash_narrow:NarrowFlash}  # the narrow real kernel
t0=$(date +%s)

note() { echo "== $1 ($(($(date +%s) - t0)) s)"; }

machine() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1
    "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
    tree_line
}

# "tree COMMIT", or, where the files differ from that commit (a copied working tree whose git
# data is older than its files), "tree COMMIT with changes, content ID": ID hashes every file
# git tracks or would (the same command on a checkout gives the same ID for the same files;
# sorted bytewise: the device's locale ordered the names differently and the IDs differed)
tree_line() {
    local head
    head=$(git rev-parse --short HEAD 2>/dev/null) || return 0
    if [ -z "$(git status --porcelain 2>/dev/null)" ]; then
        echo "tree $head"
    else
        echo "tree $head with changes, content $(content_id)"
    fi
}

content_id() {
    git ls-files -co --exclude-standard -z | LC_ALL=C sort -z | xargs -0 sha1sum 2>/dev/null | sha1sum | cut -c1-12
}

# the fast kernels' GPU tests other than the launch tests, present in this tree
smoke_tests() {
    local f
    for f in "$TESTS"/test_fast_sdpa_smoke.py "$TESTS"/test_fast_dsa_smoke.py "$TESTS"/test_fast_reliability.py \
             "$TESTS"/test_fast_multi_device.py "$TESTS"/test_fast_sdpa_gluon.py; do
        [ -f "$f" ] && echo "$f"
    done
}

task_check() {
    local d=$1
    SDPA_AUTOTUNE=0 ATTENTION_ORACLE_FAST_LAUNCH=check timeout 90 "$PY" -m pytest -p no:cacheprovider \
        -q -n 4 -rfE "$TESTS"/test_fast_launch.py > "$d/launch.log" 2>&1
    note "launch tests (check mode): exit $?"; grep -E "passed|failed|FAILED|ERROR" "$d/launch.log" | cut -c1-200 | tail -6
    # shellcheck disable=SC2046
    timeout "${SMOKE_S:-380}" "$PY" -m pytest -p no:cacheprovider -q -n 4 -rfE --tb=line $(smoke_tests) \
        > "$d/smoke.log" 2>&1
    note "smoke, reliability, Gluon, multi-device: exit $?"
    grep -E "passed|failed|FAILED|ERROR|Error" "$d/smoke.log" | cut -c1-300 | tail -12
    timeout 50 "$PY" -m attention_oracle calibrate --impl controls --area dsa,index --device "$DEVICE" \
        --control DocumentLeak,GradientsForInvalidSlots,CausalOffByOne,LengthsCountValidSlots,UnstableCompaction \
        --control-examples 20 --budget-s 40 --no-png --out "$d/cal-controls" > "$d/controls.log" 2>&1
    note "controls on $DEVICE: exit $?"
    sed -n '/^Negative controls/,/^Cut/p' "$d/cal-controls/calibration.txt" 2>/dev/null | head -30
}

task_conformance() {
    local d=$1 impls=() i
    for i in ${IMPLS:-fast}; do impls+=(--impl "$i"); done
    OUT=$d BUDGET=${BUDGET:-500} WORKERS=${WORKERS:-12} bash .ci/gpu conformance "${impls[@]}"
    note "gpu-profile conformance (${IMPLS:-fast}); report $d/conformance.json"
}

# the opt-in modes' verdicts a change of default needs: the Gluon forward's tests (its variant
# tiles included), then the conformance suite on fast under each opt-in mode, one area each
task_optin() {
    local d=$1 b=${OPTIN_BUDGET:-140} c=${OPTIN_CHECK_S:-30}
    ATTENTION_ORACLE_GLUON_VARIANTS=1 timeout 120 "$PY" -m pytest -p no:cacheprovider -q -n 8 -rfE \
        --tb=line "$TESTS"/test_fast_sdpa_gluon.py > "$d/gluon_tests.log" 2>&1
    note "Gluon forward tests, variants included: exit $?"
    grep -E "passed|failed|FAILED|ERROR" "$d/gluon_tests.log" | cut -c1-300 | tail -8
    ATTENTION_ORACLE_FAST_SDPA_FWD=gluon OUT=$d BUDGET=$b WORKERS=${WORKERS:-12} bash .ci/gpu \
        sdpa_gluon --impl fast --oracle-check-budget "$c" attention_oracle/conformance/test_sdpa.py
    ATTENTION_ORACLE_FAST_SDPA_DQ=atomic OUT=$d BUDGET=$b WORKERS=${WORKERS:-12} bash .ci/gpu \
        sdpa_atomic_dq --impl fast --oracle-check-budget "$c" attention_oracle/conformance/test_sdpa.py
    note "opt-in conformance runs; reports $d/{sdpa_gluon,sdpa_atomic_dq}.json"
}

task_sdpa() {
    local d=$1
    timeout "${SDPA_S:-470}" "$PY" -m benchmarks.sdpa --lengths "${SDPA_LENGTHS:-1024,4096,16384}" --dims 64,128 --precompile 14 ${ATOMIC_DQ:+--atomic-dq} \
        --rounds "${SDPA_ROUNDS:-3}" --budget-s "${SDPA_BUDGET:-380}" --out "$d/sdpa.json" > "$d/sdpa.log" 2>&1
    note "benchmarks.sdpa: exit $?"; tail -40 "$d/sdpa.log" | cut -c1-200
    timeout 60 "$PY" -m benchmarks.compare --impl fast --impl torch --lengths 1024,4096 --reps 5 \
        --areas sdpa --out "$d/compare.json" > "$d/compare.log" 2>&1
    note "benchmarks.compare fast torch: exit $?"; tail -20 "$d/compare.log"
}

# the Gluon forward's tiles side by side (cuDNN and the Triton forward in the same run): the
# warp-specialised default and its ping-pong form at D 64 and 128, the three-consumer tile
# (FA3's for head dim 64) and its ping-pong form at D 64; then where its host time goes
task_gluonfwd() {
    local d=$1
    ATTENTION_ORACLE_GLUON_VARIANTS=1 timeout 150 "$PY" -m pytest -p no:cacheprovider -q -n 8 -rfE \
        --tb=line "$TESTS"/test_fast_sdpa_gluon.py -k other_configs > "$d/variant_tests.log" 2>&1
    note "Gluon forward variant tests: exit $?"; grep -E "passed|failed|FAILED|ERROR" "$d/variant_tests.log" | cut -c1-300 | tail -8
    timeout 200 "$PY" -m benchmarks.sdpa_gluon --configs 128,128,2,4,1 128,128,2,4,2 --shapes 0,1,2 \
        --dims 64,128 --json "$d/gluon.json" > "$d/gluon.log" 2>&1
    note "benchmarks.sdpa_gluon (WS, ping-pong): exit $?"; grep -v "^{" "$d/gluon.log" | tail -28
    timeout 120 "$PY" -m benchmarks.sdpa_gluon --configs 128,128,2,4,1 192,128,2,4,1 192,128,2,4,2 \
        --shapes 0,1,2 --dims 64 --json "$d/gluon_d64.json" > "$d/gluon_d64.log" 2>&1
    note "benchmarks.sdpa_gluon D 64 (two and three consumers): exit $?"; grep -v "^{" "$d/gluon_d64.log" | tail -20
    timeout 60 "$PY" -m benchmarks.sdpa_gluon --host-parts --dims 64,128 \
        --json "$d/gluon_host.json" > "$d/gluon_host.log" 2>&1
    note "benchmarks.sdpa_gluon --host-parts: exit $?"; tail -2 "$d/gluon_host.log"
}

task_dsa() {
    local d=$1
    if [ -n "${TUNE:-}" ]; then
        timeout "${TUNE_S:-300}" "$PY" -m benchmarks.dsa_tune --jobs 14 --only "$TUNE" --out "$d/dsa_tune.json" \
            > "$d/dsa_tune.log" 2>&1
        note "benchmarks.dsa_tune $TUNE: exit $?"; sed -n '/^doc_16384 (T/,$p' "$d/dsa_tune.log" | cut -c1-150
    fi
    timeout "${DSA_S:-360}" "$PY" -m benchmarks.dsa --quick --budget-s "${DSA_BUDGET:-170}" \
        --skip hole_sweep,backward_memory,torch_gather_baseline --out "$d/dsa.json" > "$d/dsa.log" 2>&1
    note "benchmarks.dsa --quick: exit $?"; tail -45 "$d/dsa.log"
    timeout 150 "$PY" -m benchmarks.dsa_gluon --out "$d/dsa_gluon.json" > "$d/dsa_gluon.log" 2>&1
    note "benchmarks.dsa_gluon (forward backends, same run): exit $?"; cat "$d/dsa_gluon.log" | cut -c1-300
    if [ "${FP32:-0}" = 1 ]; then
        timeout 240 "$PY" -m benchmarks.dsa --quick --only fp32 --out "$d/dsa_fp32.json" > "$d/dsa_fp32.log" 2>&1
        note "benchmarks.dsa --only fp32: exit $?"; grep -E "^fp32 (sweep|doc)" "$d/dsa_fp32.log" | cut -c1-160
    fi
}

task_overhead() {
    local d=$1
    timeout 90 "$PY" -m benchmarks.overhead --areas sdpa,dsa --pairs 15 --out "$d/pairs.json" > "$d/pairs.log" 2>&1
    note "overhead, fast and torch in turn: exit $?"; grep -v ":issue" "$d/pairs.log" | tail -30
    timeout 60 "$PY" -m benchmarks.overhead --areas sdpa,dsa --launch-modes direct,triton \
        --out "$d/launch_modes.json" > "$d/launch_modes.log" 2>&1
    note "overhead, direct vs Triton launches: exit $?"; grep -v ":issue" "$d/launch_modes.log" | tail -25
    timeout 60 "$PY" -m benchmarks.host_threads > "$d/host_threads.log" 2>&1
    note "host threads: exit $?"; tail -20 "$d/host_threads.log"
}

# calibration: step NAME BUDGET SIGNAL CMD... runs CMD with a hard limit of BUDGET + GRACE
cal_step() {
    local d=$1 name=$2 budget=$3 sig=$4 start rc
    shift 4
    start=$(date +%s)
    timeout -s "$sig" -k 15 $((budget + ${GRACE:-30})) "$@" > "$d/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(($(date +%s) - start)) s (budget $budget s; log $d/$name.log)"
}

# the calibration tables of DIR: correct implementations whole, controls only where not ok
cal_tables() {
    local txt=$1/calibration.txt rows ok
    if [ ! -s "$txt" ]; then echo "   (no table written: see the log)"; return; fi
    head -1 "$txt"
    awk '/^Correct implementations/{p=1} /^Negative controls/{p=0} p' "$txt"
    awk '/^Known failure classes/{p=1} /^Negative controls/{p=0} p' "$txt" | head -12
    awk '/^Negative controls/{p=1} /^Cut|^Not run/{p=0} p' "$txt" > "$1/.controls"
    rows=$(tail -n +4 "$1/.controls" | grep -c .)
    if [ "$rows" -gt 0 ]; then
        ok=$(tail -n +4 "$1/.controls" | grep -c ' ok$')
        head -3 "$1/.controls"
        echo "  ($ok of $rows rows ok; the others:)"
        tail -n +4 "$1/.controls" | grep -v ' ok$' | grep . | head -60
    fi
    grep -A4 "^Cut" "$txt" | head -5
}

task_calibration() {
    local d=$1 steps=" ${STEPS:-1 2 3 4 5} " sizes=${SIZES:-large}
    local b_controls=${B_CONTROLS:-120} b_torch=${B_TORCH:-60} b_rule=${B_RULE:-80}
    local b_narrow=${B_NARROW:-60} b_fast=${B_FAST:-40}
    case $steps in *" 1 "*)
        cal_step "$d" calibrate-controls "$b_controls" TERM \
            "$PY" -m attention_oracle calibrate --impl controls --device "$DEVICE" --sizes "$sizes" \
            --control-examples "${CONTROL_EXAMPLES:-40}" --budget-s "$b_controls" --out "$d/cal-controls"
        cal_tables "$d/cal-controls";;
    esac
    case $steps in *" 2 "*)
        cal_step "$d" calibrate-torch "$b_torch" TERM \
            "$PY" -m attention_oracle calibrate --impl oracle,torch,torch-math,torch-flash,torch-efficient,torch-cudnn \
            --device "$DEVICE" --sizes "$sizes" --examples "${EXAMPLES:-10}" --budget-s "$b_torch" --out "$d/cal-torch"
        cal_tables "$d/cal-torch";;
    esac
    case $steps in *" 3 "*)
        cal_step "$d" rule-calibration "$b_rule" TERM \
            "$PY" -m benchmarks.rule_calibration --device "$DEVICE" --dtypes float32 --no-floor --f8 \
            --impl torch,torch-efficient,torch-cudnn,torch-flex --examples 6 --examples-for torch-flex=2 \
            --budget-s "$b_rule" --json "$d/rule_calibration.json"
        grep -E "^(sdpa|dsa) |^rule_calibration:" "$d/rule-calibration.log" | cut -c1-200;;
    esac
    case $steps in *" 4 "*)
        # pytest writes its report when interrupted (SIGINT), as .ci/gpu relies on
        cal_step "$d" narrow-flash "$b_narrow" INT \
            "$PY" -m attention_oracle check --impl "$NARROW" -p no:cacheprovider \
            --hypothesis-profile "${NARROW_PROFILE:-gpu}" --oracle-report "$d/narrow.json" -q -rfE
        grep -E "^FAILED|^ERROR|passed|failed|^not verified|report written" "$d/narrow-flash.log" | cut -c1-300 | tail -20
        "$PY" - "$d/narrow.json" <<'EOF'
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
    case $steps in *" 5 "*)
        cal_step "$d" calibrate-fast "$b_fast" TERM \
            "$PY" -m attention_oracle calibrate --impl fast --device "$DEVICE" --sizes small \
            --examples "${FAST_EXAMPLES:-4}" --budget-s "$b_fast" --out "$d/cal-fast"
        cal_tables "$d/cal-fast";;
    esac
}

task_profile() {
    local d=$1
    ncu --version | tail -1
    timeout 330 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        "$PY" -m benchmarks.profile_kernels ${ONLY:+--only "$ONLY"} > "$d/ncu.txt" 2>&1
    note "ncu: exit $?"
    grep -E "^== workload|^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Dynamic Shared|Block Size|Grid Size" \
        "$d/ncu.txt" | cut -c1-160 | head -150
}

# one small case of a new kernel before the rest: one that hangs (its barriers) or fails costs
# 90 s, not the whole device call. first_case DIR NAME TEST (NAME dsa or sdpa): its exit status
DSA_FIRST="$TESTS/test_fast_dsa_gluon.py::test_gluon_backward_agrees[odd_block_count-bf16-None]"
SDPA_FIRST="$TESTS/test_fast_sdpa_gluon.py::test_gluon_backward_agrees[tma-128-300-777-True-bf16]"
first_case() {
    local d=$1 name=$2 rc
    timeout 90 "$PY" -m pytest -q -x -p no:cacheprovider "$3" > "$d/$name-first.log" 2>&1
    rc=$?
    note "the Gluon $name backward, first case: exit $rc"; tail -15 "$d/$name-first.log" | cut -c1-300
    return $rc
}

task_dsabwd() {
    local d=$1
    first_case "$d" dsa "$DSA_FIRST" || return 1
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider "$TESTS/test_fast_dsa_gluon.py" -k backward \
        > "$d/tests.log" 2>&1
    note "Gluon backward tests: exit $?"; tail -15 "$d/tests.log" | cut -c1-300
    timeout 150 "$PY" -m benchmarks.dsa_gluon --backward --out "$d/dsa_gluon_bwd.json" \
        > "$d/bench.log" 2>&1
    note "benchmarks.dsa_gluon --backward: exit $?"; cut -c1-300 "$d/bench.log"
    ATTENTION_ORACLE_FAST_DSA_BWD=gluon OUT=$d BUDGET=${BUDGET:-170} WORKERS=${WORKERS:-12} \
        bash .ci/gpu conformance-dsa --impl fast --oracle-check-budget "${OPTIN_CHECK_S:-30}" -k dsa
    note "conformance -k dsa under the Gluon backward; report $d/conformance-dsa.json"
}

task_sdpabwd() {
    local d=$1
    first_case "$d" sdpa "$SDPA_FIRST" || return 1
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider "$TESTS/test_fast_sdpa_gluon.py" -k backward \
        > "$d/tests.log" 2>&1
    note "Gluon SDPA backward tests: exit $?"; tail -15 "$d/tests.log" | cut -c1-300
    timeout 240 "$PY" -m benchmarks.sdpa_gluon_bwd --schedules "${GLUON_BWD_SCHEDULES:-auto,tma_deferred}" \
        --json "$d/sdpa_gluon_bwd.json" > "$d/bench.log" 2>&1
    note "benchmarks.sdpa_gluon_bwd: exit $?"; cut -c1-400 "$d/bench.log"
    ATTENTION_ORACLE_FAST_SDPA_BWD=gluon OUT=$d BUDGET=${BUDGET:-150} WORKERS=${WORKERS:-12} \
        bash .ci/gpu conformance-sdpa --impl fast --oracle-check-budget "${OPTIN_CHECK_S:-30}" -k sdpa
    note "conformance -k sdpa under the Gluon backward; report $d/conformance-sdpa.json"
}

task_bwddefault() {
    local d=$1
    ATTENTION_ORACLE_FAST_SDPA_BWD=gluon timeout "${SMOKE_S:-260}" "$PY" -m pytest -p no:cacheprovider \
        -q -n 8 -rfE --tb=short "$TESTS"/test_fast_sdpa_smoke.py "$TESTS"/test_fast_sdpa_edges.py \
        "$TESTS"/test_fast_sdpa_gluon.py "$TESTS"/test_fast_sdpa_backends.py \
        "$TESTS"/test_fast_reliability.py "$TESTS"/test_fast_perf_paths.py > "$d/tests.log" 2>&1
    note "fast's SDPA GPU tests under the Gluon backward: exit $?"
    grep -E "passed|failed|FAILED|ERROR|Error" "$d/tests.log" | cut -c1-300 | tail -12
    ATTENTION_ORACLE_FAST_SDPA_BWD=gluon OUT=$d BUDGET=${BWD_BUDGET:-200} WORKERS=${WORKERS:-12} \
        bash .ci/gpu sdpa_gluon_bwd --impl fast --oracle-check-budget "${BWD_CHECK_S:-40}" \
        attention_oracle/conformance/test_sdpa.py \
        attention_oracle/conformance/test_regressions.py
    ATTENTION_ORACLE_FAST_SDPA_BWD=auto OUT=$d BUDGET=90 WORKERS=4 bash .ci/gpu sdpa_auto_determinism --impl fast \
        --oracle-check-budget 60 attention_oracle/conformance/test_sdpa.py -k determinism
    note "conformance under the Gluon backward, determinism under auto; reports $d/*.json"
}

task_newbwd() {
    local d=$1
    timeout 90 "$PY" -m attention_oracle.fast.kernels.gluon_probe dsa_bwd sdpa_bwd_d128 sdpa_bwd_d64 \
        > "$d/probe.log" 2>&1
    note "gluon_probe of the backwards (this machine's Triton): exit $?"; cut -c1-200 "$d/probe.log"
    if first_case "$d" dsa "$DSA_FIRST"; then
        timeout 150 "$PY" -m benchmarks.dsa_gluon --backward --reps 5 \
            --out "$d/dsa_gluon_bwd.json" > "$d/dsa_bench.log" 2>&1
        note "benchmarks.dsa_gluon --backward: exit $?"; cut -c1-300 "$d/dsa_bench.log"
    fi
    if first_case "$d" sdpa "$SDPA_FIRST"; then
        timeout 150 "$PY" -m benchmarks.sdpa_gluon_bwd --shapes 1 --json "$d/sdpa_gluon_bwd.json" \
            > "$d/sdpa_bench.log" 2>&1
        note "benchmarks.sdpa_gluon_bwd --shapes 1: exit $?"; cut -c1-400 "$d/sdpa_bench.log"
    fi
}

task_gluoncover() {
    local d=$1
    timeout 120 "$PY" -m attention_oracle.fast.kernels.gluon_probe sdpa_fwd_d128 sdpa_fwd_d128_bool_mask \
        sdpa_fwd_d64_add_mask sdpa_bwd_d128_tma sdpa_bwd_d128_tma_deferred sdpa_bwd_d64_tma_deferred \
        sdpa_bwd_d128_bool_mask sdpa_bwd_d64_add_mask sdpa_fwd_d128_persistent sdpa_fwd_d256_causal \
        > "$d/probe.log" 2>&1
    note "gluon_probe (this machine's Triton): exit $?"; cut -c1-200 "$d/probe.log"
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider -n 8 -rfE --tb=short "$TESTS/test_fast_sdpa_gluon.py" \
        -k "mask or between_tiles or tma_deferred or 256_column" > "$d/tests.log" 2>&1
    note "Gluon mask / head dim / deferred-schedule tests: exit $?"
    grep -E "passed|failed|FAILED|ERROR" "$d/tests.log" | cut -c1-300 | tail -12
    # apart: a hang of the persistent program's barriers ends this run alone (its timeout)
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short \
        "$TESTS/test_fast_sdpa_gluon.py" -k persistent > "$d/persistent_tests.log" 2>&1
    note "Gluon persistent forward tests: exit $?"; tail -6 "$d/persistent_tests.log" | cut -c1-300
}

task_persistent() {
    local d=$1
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -n 8 -rfE --tb=short \
        "$TESTS/test_fast_sdpa_gluon.py" -k "persistent or repeat_calls or gluon_forward_agrees" \
        > "$d/tests.log" 2>&1
    note "Gluon forward tests (persistent default): exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    timeout 300 "$PY" -m benchmarks.sdpa_gluon --configs 128,128,2,4,3 128,128,2,4,1 \
        --shapes 0,1,2 --dims 64,128 --json "$d/gluon_persistent.json" > "$d/gluon.log" 2>&1
    note "benchmarks.sdpa_gluon (persistent, one-block WS): exit $?"; grep -v "^{" "$d/gluon.log" | tail -28
    timeout 60 "$PY" -m benchmarks.sdpa_gluon --host-parts --dims 64,128 \
        --json "$d/gluon_host.json" > "$d/gluon_host.log" 2>&1
    note "benchmarks.sdpa_gluon --host-parts: exit $?"; tail -2 "$d/gluon_host.log"
    if command -v ncu > /dev/null; then
        timeout 120 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section WarpStateStats \
            "$PY" -m benchmarks.profile_kernels --only sdpa_fwd_fast_1k_causal,sdpa_fwd_cudnn_1k_causal \
            > "$d/ncu.txt" 2>&1
        note "ncu: exit $?"; grep -E "^  [a-zA-Z_].*\(|Duration|L2 Hit|Compute \(SM\)|No Eligible" \
            "$d/ncu.txt" | cut -c1-150
    fi
}

task_order() {
    local d=$1
    ATTENTION_ORACLE_GLUON_VARIANTS=1 timeout 150 "$PY" -m pytest -p no:cacheprovider -q -n 8 -rfE \
        --tb=short "$TESTS/test_fast_sdpa_gluon.py" "$TESTS/test_fast_sdpa_smoke.py" \
        -k "three_stages or causal_sections or causal_program or dealt_order" > "$d/tests.log" 2>&1
    note "tests of sections and three stages: exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    timeout 200 "$PY" -m benchmarks.causal_order --dims 64,128 --lengths 1024,4096 --rounds 5 \
        --json "$d/causal_order.json" > "$d/causal_order.log" 2>&1
    note "benchmarks.causal_order: exit $?"; grep -E "^D |fwdbwd section" "$d/causal_order.log"
    timeout 200 "$PY" -m benchmarks.sdpa_gluon --configs 128,128,2,4,3 128,128,3,4,3 --shapes 0,1,2 \
        --dims 64 --json "$d/gluon_d64_stages.json" > "$d/gluon.log" 2>&1
    note "benchmarks.sdpa_gluon D 64, two and three stages: exit $?"; grep -v "^{" "$d/gluon.log" | tail -16
}

# the persistent forward's variant forms beside the default: the variant tests, then
# benchmarks.sdpa_gluon with the default, its ping-pong consumers (PERSISTENT_PINGPONG), the
# causal diagonal's half tile (PERSISTENT_HALF) and both (D 64 and 128, L 1k and 4k), then
# Nsight Compute on the causal L 1k rows at D 64 (forward: fast, cuDNN, the ping-pong program;
# backward: fast, cuDNN) when ncu is there
task_fwdforms() {
    local d=$1
    ATTENTION_ORACLE_GLUON_VARIANTS=1 timeout "${FORMS_TESTS_S:-150}" "$PY" -m pytest -p no:cacheprovider \
        -q -n 12 -rfE --tb=short "$TESTS/test_fast_sdpa_gluon.py" -k "${FORMS_TESTS_K:-persistent_program_variants}" \
        > "$d/tests.log" 2>&1
    note "persistent variant tests: exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    timeout "${FORMS_S:-240}" "$PY" -m benchmarks.sdpa_gluon --configs ${FORMS_CONFIGS:-128,128,2,4,3 \
        128,128,2,4,4 128,128,2,4,5 128,128,2,4,6} --shapes "${FORMS_SHAPES:-0,1}" --dims "${FORMS_DIMS:-64,128}" \
        --rounds "${FORMS_ROUNDS:-3}" --json "$d/gluon_forms.json" > "$d/gluon.log" 2>&1
    note "benchmarks.sdpa_gluon, the persistent forms: exit $?"; grep -v "^{" "$d/gluon.log" | tail -30
    if command -v ncu > /dev/null; then
        timeout "${FORMS_NCU_S:-150}" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
            --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            --section MemoryWorkloadAnalysis --section Occupancy "$PY" -m benchmarks.profile_kernels \
            --only "${FORMS_NCU:-sdpa_fwd_fast_1k_causal_d64,sdpa_fwd_cudnn_1k_causal_d64,sdpa_bwd_1k_causal_d64_fast,sdpa_bwd_1k_causal_d64_cudnn,sdpa_fwd_gluon_pingpong_1k_causal_d64}" \
            > "$d/ncu.txt" 2>&1
        note "ncu: exit $?"
        grep -E "^== workload|^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|Issue Slots Busy|No Eligible|Eligible Warps|Registers Per|Achieved Occupancy|Grid Size|Block Size" \
            "$d/ncu.txt" | cut -c1-150 | head -120
    fi
}

# base_packages DIR PACKAGE...: the base tree's packages (folders) into DIR, emptied first: from
# BASE_TREE (a folder holding them) or else BASE (a commit, default HEAD~1) by git archive
base_packages() {
    local dir=$1 base=${BASE:-HEAD~1} p
    shift
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    if [ -n "${BASE_TREE:-}" ]; then
        for p in "$@"; do cp -r "$BASE_TREE/$p" "$dir" || return 1; done
        note "BASE the tree in $BASE_TREE"
    else
        git archive "$base" "$@" | tar -x -C "$dir" || { note "no $base"; return 1; }
        note "BASE $base = $(git rev-parse --short "$base")"
    fi
}

task_base() {
    local d=$1 i tree py
    py=$(command -v "$PY") && py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # from any folder
    base_packages "$d/tree" attention_oracle benchmarks || return 1
    for i in $(seq "${BASE_ROUNDS:-2}"); do
        for tree in this base; do
            local dir=. json=(--json "$d/this$i.json")
            [ "$tree" = base ] && dir=$d/tree json=()
            (cd "$dir" && PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} timeout "${BASE_S:-120}" "$py" \
                -m benchmarks.sdpa_gluon --configs "${BASE_CONFIG:-128,128,2,4,3}" --shapes 0,1 \
                --dims "${BASE_DIMS:-64,128}" --causal "${BASE_CAUSAL:-1}" --rounds 2 "${json[@]}") \
                > "$d/$tree$i.log" 2>&1
            note "$tree, round $i: exit $?"
            grep -h "^{" "$d/$tree$i.log" | "$PY" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("  D %d L %d causal %d: gluon %.0f (%.3f of cuDNN queued, %.3f synced), triton %.0f "
          "(%.3f, %.3f), cuDNN %.0f; err %.1e" % (
              r["D"], r["L"], r["causal"], r["gluon_queued"], r["gluon_over_cudnn_queued"],
              r["gluon_over_cudnn_synced"], r["triton_queued"],
              r["triton_queued"] / r["cudnn_queued"], r["triton_synced"] / r["cudnn_synced"],
              r["cudnn_queued"], r["err64_gluon"]))'
        done
    done
}

task_form() {
    local d=$1 form=${FORM:-half}
    export ATTENTION_ORACLE_FAST_SDPA_FWD_FORM=$form
    timeout "${FORM_TESTS_S:-240}" "$PY" -m pytest -p no:cacheprovider -q -n 12 -rfE --tb=line \
        "$TESTS/test_fast_sdpa_gluon.py" "$TESTS/test_fast_sdpa_smoke.py" \
        "$TESTS/test_fast_sdpa_edges.py" "$TESTS/test_fast_sdpa_backends.py" > "$d/tests.log" 2>&1
    note "fast's SDPA GPU tests under the form $form: exit $?"
    grep -E "passed|failed|FAILED|ERROR" "$d/tests.log" | cut -c1-300 | tail -10
    ATTENTION_ORACLE_FAST_SDPA_FWD=gluon OUT=$d BUDGET=${FORM_BUDGET:-140} WORKERS=${WORKERS:-12} \
        bash .ci/gpu sdpa_form --impl fast --oracle-check-budget "${OPTIN_CHECK_S:-30}" \
        attention_oracle/conformance/test_sdpa.py
    note "conformance SDPA checks under the Gluon forward and the form $form; report $d/sdpa_form.json"
    # shellcheck disable=SC2086
    timeout "${FORM_S:-150}" "$PY" -m benchmarks.sdpa_gluon --configs ${FORM_CONFIGS:-128,128,2,4,3 \
        128,128,2,4,5} --shapes 0,1 --dims 64,128 --causal 0,1 --rounds 2 --json "$d/gluon_form.json" \
        > "$d/gluon.log" 2>&1
    note "benchmarks.sdpa_gluon, FORM_CONFIGS (the full and the half diagonal's): exit $?"
    grep -v "^{" "$d/gluon.log" | tail -12
    unset ATTENTION_ORACLE_FAST_SDPA_FWD_FORM
}

task_tunecarry() {
    local d tree first here py
    d=$(cd "$1" && pwd) || return 1  # absolute: the base's runs start in its folder
    py=$(command -v "$PY") && py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")
    here=$(pwd)
    base_packages "$d/tree" attention_oracle || return 1
    for tree in this base; do
        for first in 2,3,1000 none; do
            local root=$here
            [ "$tree" = base ] && root=$d/tree
            # the base's folder holds its attention_oracle alone: this tree's benchmarks after it
            (cd "$root" && TRITON_CACHE_DIR="$d/cache" PYTHONPATH=$root:$here${PYTHONPATH:+:$PYTHONPATH} \
                timeout "${CARRY_S:-150}" "$py" -m benchmarks.tune_carry --first "$first" \
                --json "$d/carry.jsonl") > "$d/$tree-$first.log" 2>&1
            note "$tree, first $first: exit $?"; grep -h "^{" "$d/$tree-$first.log" | cut -c1-400
            rm -rf "$d/cache"
        done
    done
    rm -rf "$d/tree"
}

task_tunevar() {
    local d=$1 i
    for i in $(seq "${TUNE_RUNS:-4}"); do
        TRITON_CACHE_DIR="$d/cache$i" timeout 120 "$PY" -m benchmarks.sdpa_gluon_bwd --shapes 0 \
            --dims 64 --causal 1 --json "$d/run$i.json" > "$d/run$i.log" 2>&1
        note "run $i from an empty cache: exit $?"
        grep -E "^D 64 L 1024|tile, key" "$d/run$i.log" | cut -c1-260
        rm -rf "$d/cache$i"
    done
}

task_index() {
    local d=$1
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider -n 8 -rfE --tb=short \
        "$TESTS/test_fast_dsa_smoke.py" "$TESTS/test_fast_launch.py" \
        -k "kept or offset or index or addresses or varlen or strided_lengths" > "$d/tests.log" 2>&1
    note "index preparation and launch tests: exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    timeout 90 "$PY" -m benchmarks.index_prep --host-parts --out "$d/index_host.json" \
        > "$d/host.log" 2>&1
    note "benchmarks.index_prep --host-parts: exit $?"; tail -2 "$d/host.log"
    timeout 150 "$PY" -m benchmarks.index_prep --warps 0 --out "$d/index_prep.json" \
        > "$d/table.log" 2>&1
    note "benchmarks.index_prep --warps 0: exit $?"; tail -4 "$d/table.log"
}

task_fp32() {
    local d=$1
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -p no:randomly -n 11 -rfE --tb=short \
        "$TESTS/test_fast_sdpa_smoke.py" -k tf32x3 > "$d/tests.log" 2>&1
    note "fp32 tf32x3 tests: exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    TRITON_PRINT_AUTOTUNING=1 timeout 240 "$PY" -m benchmarks.sdpa --lengths none --no-rank3 \
        --no-memory --rounds 2 --fp32-modes tf32x3,tf32x3+kernel \
        --fp32-shapes "2,16,2048,128;4,16,1024,128;1,16,4096,128;2,16,2048,64" \
        --out "$d/sdpa_fp32.json" > "$d/bench.log" 2>&1
    note "benchmarks.sdpa fp32 rows: exit $?"; grep -E "^fp32 B" "$d/bench.log" | cut -c1-400
    grep "best config" "$d/bench.log" | sort | uniq -c
}

task_gluontime() {
    local d=$1
    timeout 100 "$PY" -m benchmarks.sdpa_gluon --configs 128,128,2,4,1 128,128,2,4,3 --shapes 0,1 \
        --dims 128 --json "$d/gluon_persistent.json" > "$d/gluon_persistent.log" 2>&1
    note "benchmarks.sdpa_gluon (WS, persistent): exit $?"; grep -v "^{" "$d/gluon_persistent.log" | tail -10
    for m in bool padding add; do
        timeout 60 "$PY" -m benchmarks.sdpa_gluon --configs 128,128,2,4,1 --shapes 1 --causal 0 \
            --dims 128,96 --mask "$m" --json "$d/gluon_mask_$m.json" > "$d/gluon_mask_$m.log" 2>&1
        note "benchmarks.sdpa_gluon --mask $m: exit $?"; grep -v "^{" "$d/gluon_mask_$m.log" | tail -6
    done
    timeout 200 "$PY" -m benchmarks.sdpa_gluon_bwd --shapes 1,2 --schedules auto,tma_deferred,serial \
        --json "$d/sdpa_gluon_bwd.json" > "$d/bench.log" 2>&1
    note "benchmarks.sdpa_gluon_bwd (auto, tma_deferred, serial): exit $?"; cut -c1-400 "$d/bench.log"
}

# the L2 prefetch of key rows ahead of their gather (PREFETCH of the Gluon DSA kernels): its GPU
# tests (no value moves), then the forward and the backward on doc_16384 and packed_glm_a with
# 0, 1 and 2 blocks (pairs) ahead side by side
task_prefetch() {
    local d=$1
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -n 4 -rfE --tb=short \
        "$TESTS/test_fast_dsa_gluon.py" -k prefetch > "$d/tests.log" 2>&1
    note "L2 prefetch tests: exit $?"; tail -8 "$d/tests.log" | cut -c1-300
    timeout 170 "$PY" -m benchmarks.dsa_gluon --prefetch 1,2 --reps 5 \
        --out "$d/dsa_gluon_prefetch.json" > "$d/fwd.log" 2>&1
    note "benchmarks.dsa_gluon --prefetch 1,2: exit $?"; cut -c1-300 "$d/fwd.log"
    timeout 200 "$PY" -m benchmarks.dsa_gluon --backward --prefetch 1,2 --reps 5 \
        --out "$d/dsa_gluon_bwd_prefetch.json" > "$d/bwd.log" 2>&1
    note "benchmarks.dsa_gluon --backward --prefetch 1,2: exit $?"; cut -c1-300 "$d/bwd.log"
}

task_slotorder() {
    local d=$1
    timeout 200 "$PY" -m benchmarks.dsa_order --backward --concurrency "${SLOT_C:-132}" \
        --out "$d/dsa_order.json" > "$d/order.log" 2>&1
    note "benchmarks.dsa_order: exit $?"; cut -c1-200 "$d/order.log" | tail -22
    export ATTENTION_ORACLE_FAST_DSA_ORDER=${SLOT_ORDER:-on}
    timeout 200 "$PY" -m benchmarks.dsa --quick --only fast --out "$d/dsa.json" > "$d/dsa.log" 2>&1
    note "benchmarks.dsa --quick --only fast: exit $?"; grep -E "doc_|packed" "$d/dsa.log" | tail -8 | cut -c1-200
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -n 8 "$TESTS/test_fast_dsa_gluon.py" \
        "$TESTS/test_fast_dsa_smoke.py" > "$d/tests.log" 2>&1
    note "fast's DSA GPU tests: exit $?"; tail -4 "$d/tests.log" | cut -c1-300
    OUT=$d BUDGET=${SLOT_BUDGET:-150} bash .ci/gpu conf_fixtures --impl fast \
        attention_oracle/conformance/test_dsa_fixtures.py
    note "conformance DSA fixtures: report $d/conf_fixtures.json"
    unset ATTENTION_ORACLE_FAST_DSA_ORDER
}

task_orderform() {
    local d=$1 form
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -n 8 "$TESTS/test_fast_dsa_smoke.py" \
        -k "slot_order or ordered" > "$d/tests.log" 2>&1
    note "the ordering kernel's GPU tests: exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    for round in 1 2; do
        timeout 90 "$PY" -m benchmarks.dsa_order --problems packed_glm_a --only none \
            --forms loop,runs --reps 10 --out "$d/forms_$round.json" > "$d/forms_$round.log" 2>&1
        note "benchmarks.dsa_order --forms loop,runs, round $round: exit $?"
        cut -c1-200 "$d/forms_$round.log" | tail -4
    done
    for form in ${ORDER_FORMS:-runs loop}; do
        ATTENTION_ORACLE_FAST_DSA_ORDER_FORM=$form timeout 150 "$PY" -m benchmarks.dsa_order \
            --problems packed_glm_a --backward --reps 5 --only given,fast_backward,fast_on \
            --out "$d/dsa_order_$form.json" > "$d/order_$form.log" 2>&1
        note "benchmarks.dsa_order --backward, form $form: exit $?"; cut -c1-200 "$d/order_$form.log" | tail -5
    done
    form=${ORDER_FORMS:-runs}; form=${form%% *}
    ATTENTION_ORACLE_FAST_DSA_ORDER_FORM=$form timeout 200 "$PY" -m benchmarks.dsa --quick \
        --only fast --out "$d/dsa.json" > "$d/dsa.log" 2>&1
    note "benchmarks.dsa --quick --only fast, form $form: exit $?"; grep -E "doc_|packed" "$d/dsa.log" | tail -8 | cut -c1-200
}

task_orderpair() {
    local d=$1 pair=${PAIR:-runs:loop}
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -n 8 "$TESTS/test_fast_dsa_smoke.py" \
        -k "slot_order or ordered or orders_rows or without_backward" > "$d/tests.log" 2>&1
    note "the ordering GPU tests: exit $?"; tail -3 "$d/tests.log" | cut -c1-300
    timeout 240 "$PY" -m benchmarks.dsa_order --problems packed_glm_a --backward --reps 10 \
        --only given,fast_on --step-forms "${PAIRS:-loop:loop,runs:loop}" --rounds 3 \
        --out "$d/pairs.json" > "$d/pairs.log" 2>&1
    note "benchmarks.dsa_order --step-forms, 3 rounds: exit $?"; grep -v "^ *$" "$d/pairs.log" | tail -20 | cut -c1-200
    export ATTENTION_ORACLE_FAST_DSA_ORDER_FORM=${pair%%:*}
    export ATTENTION_ORACLE_FAST_DSA_BACKWARD_ORDER_FORM=${pair##*:}
    timeout 300 "$PY" -m benchmarks.dsa ${QUICK:+--quick} --only fast --out "$d/dsa.json" \
        > "$d/dsa.log" 2>&1
    note "benchmarks.dsa --only fast, forms $pair: exit $?"; grep -E "doc_|packed" "$d/dsa.log" | tail -8 | cut -c1-200
    [ -n "$NO_FIXTURES" ] || {
        OUT=$d BUDGET=${SLOT_BUDGET:-150} bash .ci/gpu conf_fixtures --impl fast \
            attention_oracle/conformance/test_dsa_fixtures.py
        note "conformance DSA fixtures, forms $pair: report $d/conf_fixtures.json"; }
    unset ATTENTION_ORACLE_FAST_DSA_ORDER_FORM ATTENTION_ORACLE_FAST_DSA_BACKWARD_ORDER_FORM
}

usage() {
    echo "usage: [OUT=dir] bash benchmarks/h200.sh {sdpa,gluonfwd,gluoncover,gluontime,persistent,order,fwdforms,base,form,tunecarry,tunevar,index,fp32,dsa,dsabwd,sdpabwd,bwddefault,newbwd,prefetch,slotorder,orderform,orderpair,overhead,calibration,check,conformance,profile,optin,all,id} ..." >&2
    exit 2
}

[ $# -ge 1 ] || usage
if [ "$1" = id ]; then  # the content ID of these files, to match a device run's "tree" line
    tree_line; content_id; exit 0
fi
tasks=()
for t in "$@"; do
    case $t in
        all) tasks+=(check conformance overhead sdpa dsa calibration);;
        sdpa|gluonfwd|gluoncover|gluontime|persistent|order|fwdforms|base|form|tunecarry|tunevar|index|fp32|dsa|dsabwd|sdpabwd|bwddefault|newbwd|prefetch|slotorder|orderform|orderpair|overhead|calibration|check|conformance|profile|optin) tasks+=("$t");;
        *) usage;;
    esac
done

status=0
for t in "${tasks[@]}"; do
    d=$OUT/$t
    mkdir -p "$d"
    {
        note "$t"
        machine
        "task_$t" "$d"
    } 2>&1 | tee "$d/summary.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
# the speed targets judged from every benchmark JSON under $OUT so far (this call's and earlier)
"$PY" -m benchmarks.targets "$OUT" --json "$OUT/targets.json" 2>&1 | grep -v "^ " | tee "$OUT/targets.txt"
note "done; results under $OUT/{$(IFS=,; echo "${tasks[*]}")}/, the targets in $OUT/targets.{txt,json}"
exit $status
