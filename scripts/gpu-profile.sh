#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-profile.sh: Nsight Compute profiles of the kernels behind each CUDA benchmark target, at the
# clocks the benchmarks run at: the binary GEMM at 4096^3 and 8192^3 (f16 y), the binary conv
# (b1 x and y) at each ResNet-18 layer, the 4-bit linear with its cuBLAS fp16 and int8 baselines,
# and the training step from saved bits with its dense baseline. One CSV per case (the raw
# metrics of every profiled launch) and a table per case (scripts/ncu-summary.py): each kernel's
# time, tensor-pipe busy share, SM, DRAM and L2 throughput, issue-slot use and warp-stall reasons.
#
# Usage: scripts/gpu-profile.sh [--build DIR (build-gpu)] [--out DIR (the build's logs/)], after a
# CUDA build (scripts/gpu-check.sh, or cmake with -DBIE_CUDA=ON and the target bie_bench_cuda).
# Writes ncu-*.csv, ncu-*.err and ncu-summary.txt into the --out folder.
set -u
BUILD=
LOG=
while [ $# -gt 0 ]; do
  case "$1" in
    --build|--out) [ $# -ge 2 ] || { echo "gpu-profile: $1 needs a folder"; exit 2; }
      if [ "$1" = --build ]; then BUILD=$2; else LOG=$2; fi; shift ;;
    --build=*) BUILD=${1#--build=} ;;
    --out=*) LOG=${1#--out=} ;;
    *) echo "gpu-profile: unknown option $1 (see the usage at the top of $0)"; exit 2 ;;
  esac
  shift
done
case "$BUILD" in "" | /*) ;; *) BUILD=$PWD/$BUILD ;; esac # (folders given relative to where the
case "$LOG" in "" | /*) ;; *) LOG=$PWD/$LOG ;; esac       # script was called from)
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
LOG=${LOG:-$BUILD/logs}
BENCH=$BUILD/bie_bench_cuda
command -v ncu >/dev/null || { echo "gpu-profile: ncu (Nsight Compute) not found"; exit 1; }
[ -x "$BENCH" ] || { echo "gpu-profile: $BENCH is not built"; exit 1; }
mkdir -p "$LOG"

# The metrics wanted, less those this ncu and GPU do not know (names vary between versions).
ncu --query-metrics >"$LOG/ncu-metrics.txt" 2>&1
has() { grep -qE "^$1[[:space:]]" "$LOG/ncu-metrics.txt"; }
M=gpu__time_duration.sum
for m in sm__throughput dram__throughput lts__throughput; do
  has $m && M+=",$m.avg.pct_of_peak_sustained_elapsed"
done
for m in sm__pipe_tensor_op_gmma_cycles_active sm__pipe_tensor_op_imma_cycles_active \
         sm__pipe_tensor_op_hmma_cycles_active smsp__issue_active sm__warps_active; do
  has $m && M+=",$m.avg.pct_of_peak_sustained_active"
done
for m in $(grep -oE "^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active" "$LOG/ncu-metrics.txt" | sort -u); do
  M+=",$m.ratio"
done

FAILED=0
# prof NAME KERNEL_REGEX ("" = every kernel) LAUNCHES BENCH_ARGS...: the first LAUNCHES matching
# launches of the bench's calls (warm-up calls included), without graph replays.
prof() {
  local name=$1 re=$2 n=$3
  shift 3
  local k=()
  [ -n "$re" ] && k=(-k "regex:$re")
  echo "-- $name"
  timeout 400 ncu --csv --page raw --print-units base --clock-control none --metrics "$M" "${k[@]}" \
    --launch-count "$n" "$BENCH" --call-only "$@" >"$LOG/ncu-$name.csv" 2>"$LOG/ncu-$name.err" ||
    { echo "   ncu failed (exit $?):"; tail -5 "$LOG/ncu-$name.err"; FAILED=1; }
}
prof gemm-4096 wgmma 8 --case "binary-gemm b1->f16" --shape 4096x4096x4096
prof gemm-8192 wgmma 8 --case "binary-gemm b1->f16" --shape 8192x8192x8192
for c in 64 128 256 512; do
  prof conv-b1-C$c "wgmma|weight_terms|conv_rowterms|im2col" 24 --case "binary-conv b1->b1" --shape "C$c "
done
prof int4-linear "" 110 --case int4-linear
prof train-step-bits "" 200 --case "train-step bits"
python3 scripts/ncu-summary.py "$LOG"/ncu-gemm-*.csv "$LOG"/ncu-conv-*.csv "$LOG"/ncu-int4-linear.csv \
  "$LOG"/ncu-train-step-bits.csv | tee "$LOG/ncu-summary.txt"
exit $FAILED
