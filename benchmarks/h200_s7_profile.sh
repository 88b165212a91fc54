#!/usr/bin/env bash
# Session 7: Nsight Compute on one launch of each benchmarks.profile_kernels workload (what
# limits fast's SDPA / DSA kernels against cuDNN and torch). ~4 minutes.
# Usage (device, repository root): OUT=dir bash benchmarks/h200_s7_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ncu --version | tail -1
timeout 330 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 -m benchmarks.profile_kernels > "$OUT/ncu.txt" 2>&1
echo "ncu exit $?"
grep -E "^== workload|^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Dynamic Shared|Block Size|Grid Size" "$OUT/ncu.txt" | cut -c1-160 | head -150
