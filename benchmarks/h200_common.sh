# Sourced by the H200 check scripts (benchmarks/h200_*final.sh, h200_s7_*.sh): run from the repository
# root, a work folder $W, a timer, and `finish NAME` (summary and $OUT/NAME.tgz of $W).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
W=$(mktemp -d)
export PYTHONUNBUFFERED=1
t0=$(date +%s)
note() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
finish() {
    mkdir -p "$OUT"
    cp "$W/summary.txt" "$OUT/summary.txt"
    tar czf "$OUT/$1.tgz" -C "$W" .
}
