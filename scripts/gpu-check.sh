#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-check.sh: everything that needs a GPU, in one go, on a machine with an NVIDIA GPU and the CUDA
# toolkit: a Release build with the CUDA backend, the machine-code check (binary AND-popcount and
# int8 tensor-core instructions present; no emulated XOR-popcount or int4 MMA on sm_90), the unit
# and CUDA tests, compute-sanitizer memcheck on the CUDA tests, the CUDA benchmarks and, when they
# exist, the PyTorch binding's tests and module benchmarks. Prints one summary table last.
# Logs go to $OUT when that variable is set (else to build-gpu/logs). Exits 1 when a stage failed.
#
# Usage: scripts/gpu-check.sh [--quick] [--no-bench] [--no-sanitizer] [--no-python] [--no-unit] [--profile]
#   --profile: also profile the kernels behind each benchmark target with Nsight Compute
#   (scripts/gpu-profile.sh: time, tensor-pipe use, throughput and warp stalls per kernel)
set -u
cd "$(dirname "$0")/.."
QUICK=0 BENCH=1 SAN=1 PY=1 PROF=0 LABELS="unit cuda" TARGETS=""
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    --no-bench) BENCH=0 ;;
    --no-sanitizer) SAN=0 ;;
    --no-python) PY=0 ;;
    --profile) PROF=1 ;;
    --no-unit) LABELS=cuda TARGETS="--target cuda_test-cuda-layers cuda_test-cuda-pack bie_bench_cuda bie bie_cli" ;;
  esac
done
BUILD=build-gpu
LOG=$BUILD/logs
rm -rf "$LOG"
mkdir -p "$LOG"
export PATH=/usr/local/cuda/bin:$PATH
JOBS=$(nproc)
declare -a SUMMARY=()
note() { SUMMARY+=("$(printf '%-28s %s' "$1" "$2")"); }
stage() { echo; echo "=== $* ==="; }

stage "device"
nvidia-smi -L 2>&1 | tee "$LOG/device.txt"
nvcc --version | tail -2 | tee -a "$LOG/device.txt"

stage "build (Release, CUDA on)"
t0=$(date +%s)
if cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DBIE_CUDA=ON >"$LOG/cmake.txt" 2>&1 &&
   cmake --build $BUILD -j"$JOBS" $TARGETS -- -k >"$LOG/build.txt" 2>&1; then
  note build "ok ($(( $(date +%s) - t0 )) s)"
else
  # keep going: other targets may still have built (the log names what failed)
  grep -E "error|Error" "$LOG/build.txt" | head -20
  note build "FAILED in part (see build.txt); continuing with what built"
fi

# ptxas serialises warpgroup MMAs it cannot prove uniform (C7520): a silent 20% loss at 8192^3.
if grep -q "C7520" "$LOG/build.txt"; then
  note "wgmma pipelining" "SERIALIZED in $(grep -c C7520 "$LOG/build.txt") kernels (ptxas C7520, see build.txt)"
else note "wgmma pipelining" "ok (no ptxas C7520)"; fi

stage "machine code (sm_90a)"
SASS="$LOG/sass-counts.txt"
: >"$SASS"
for o in $BUILD/CMakeFiles/bie_cuda_objects.dir/src/cuda/*.o; do
  [ -f "$o" ] || continue
  cuobjdump -sass -arch sm_90a "$o" 2>/dev/null >"$LOG/$(basename "$o").sass" || true
done
cat "$LOG"/*.o.sass 2>/dev/null | grep -oE "\b(BMMA|IMMA|HMMA|BGMMA|IGMMA)[A-Za-z0-9_.]*" | sort | uniq -c | tee "$SASS"
bmma=$(grep -c "BMMA.*AND" "$SASS" || true)
bgmma=$(grep -c "BGMMA.*AND" "$SASS" || true)
igmma=$(grep -c "IGMMA" "$SASS" || true)
xor=$(cat "$LOG"/*.o.sass 2>/dev/null | grep -cE "BMMA[^ ]*XOR|IMMA[^ ]*S4|IMMA[^ ]*U4" || true)
if [ "${bmma:-0}" -gt 0 ] && [ "${bgmma:-0}" -gt 0 ] && [ "${igmma:-0}" -gt 0 ] && [ "${xor:-0}" -eq 0 ]; then
  note "sass" "BMMA.AND, BGMMA.AND and IGMMA present, no XOR/S4 MMA"
else note "sass" "CHECK: BMMA.AND=$bmma BGMMA.AND=$bgmma IGMMA=$igmma XOR/S4=$xor"; fi

stage "ctest (unit + cuda)"
for label in $LABELS; do
  if ctest --test-dir $BUILD -L $label --output-on-failure -j4 --timeout 600 >"$LOG/ctest-$label.txt" 2>&1; then
    note "ctest -L $label" "$(grep -E 'tests passed' "$LOG/ctest-$label.txt" | tail -1)"
  else
    tail -40 "$LOG/ctest-$label.txt"
    note "ctest -L $label" "FAILED: $(grep -E 'tests passed|tests failed' "$LOG/ctest-$label.txt" | tail -1)"
  fi
done
grep -h -E "FAIL|skipped" $BUILD/Testing/Temporary/LastTest.log 2>/dev/null | head -40
# The layer tests again on the mma.sync GEMM (the sm_80 path; Hopper uses wgmma by default).
if [ -x $BUILD/tests/cuda_test-cuda-layers ]; then
  if BIE_CUDA_GEMM=mma timeout 300 $BUILD/tests/cuda_test-cuda-layers >"$LOG/cuda-layers-mma.txt" 2>&1; then
    note "layers on mma.sync" "$(tail -1 "$LOG/cuda-layers-mma.txt")"
  else
    tail -20 "$LOG/cuda-layers-mma.txt"
    note "layers on mma.sync" "FAILED (cuda-layers-mma.txt)"
  fi
fi

if [ $SAN = 1 ] && command -v compute-sanitizer >/dev/null; then
  stage "compute-sanitizer memcheck"
  ok=1
  for t in $BUILD/tests/cuda_test-*; do
    [ -x "$t" ] || continue
    if ! BIE_TEST_QUICK=1 BIE_TEST_NO_FAULT=1 timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
         "$t" >"$LOG/memcheck-$(basename "$t").txt" 2>&1; then
      ok=0
      tail -30 "$LOG/memcheck-$(basename "$t").txt"
    fi
    grep -E "ERROR SUMMARY" "$LOG/memcheck-$(basename "$t").txt"
  done
  [ $ok = 1 ] && note memcheck "clean" || note memcheck "ERRORS (see memcheck-*.txt)"
fi

# The layer fuzzer's CUDA mode (fuzz/cuda/fuzz-layers-cuda.c): random layer calls on the CUDA backend
# against the reference, under compute-sanitizer (memcheck, then racecheck and synccheck on fewer runs).
if [ $SAN = 1 ] && command -v compute-sanitizer >/dev/null && [ -x $BUILD/fuzz-layers-cuda ]; then
  stage "layer fuzzer, CUDA mode, under compute-sanitizer"
  runs=20000
  [ $QUICK = 1 ] && runs=2000
  ok=1
  for tool in memcheck racecheck synccheck; do
    n=$runs
    [ $tool != memcheck ] && n=$((runs / 10))
    if ! timeout 1500 compute-sanitizer --tool $tool --error-exitcode 9 $BUILD/fuzz-layers-cuda --runs $n --seed 1 \
         >"$LOG/fuzz-layers-cuda-$tool.txt" 2>&1; then
      ok=0
      tail -30 "$LOG/fuzz-layers-cuda-$tool.txt"
    fi
    grep -E "ERROR SUMMARY|fuzz-layers-cuda:" "$LOG/fuzz-layers-cuda-$tool.txt"
  done
  [ $ok = 1 ] && note "layer fuzzer (CUDA)" "clean ($runs cases under memcheck)" || note "layer fuzzer (CUDA)" "ERRORS (fuzz-layers-cuda-*.txt)"
fi

if [ $BENCH = 1 ]; then
  stage "benchmarks"
  BQ=""
  [ $QUICK = 1 ] && BQ="--quick"
  if [ -x $BUILD/bie ] && $BUILD/bie bench --help 2>&1 | grep -q -- "--backend"; then
    timeout 500 $BUILD/bie bench --backend cuda $BQ 2>&1 | tee "$LOG/bench-cuda.txt"
  elif [ -x $BUILD/bie_bench_cuda ]; then
    timeout 500 $BUILD/bie_bench_cuda $BQ 2>&1 | tee "$LOG/bench-cuda.txt"
  fi
  if grep -q "ratio" "$LOG/bench-cuda.txt" 2>/dev/null; then note bench "ok (bench-cuda.txt)"; else note bench "no result"; fi
fi

if [ $PROF = 1 ]; then
  stage "profiles of the benchmark targets' kernels (ncu)"
  scripts/gpu-profile.sh $BUILD "$LOG" && note profiles "ok (ncu-summary.txt)" || note profiles "FAILED (ncu-*.err)"
fi

if [ -d python/tests ] && [ $PY = 1 ]; then
  stage "python binding"
  if BIE_LIBRARY=$PWD/$BUILD/libbie.so PYTHONPATH=$PWD/python timeout 300 python3 -m pytest -q python/tests \
       >"$LOG/pytest.txt" 2>&1; then
    note pytest "$(tail -1 "$LOG/pytest.txt")"
  else
    tail -30 "$LOG/pytest.txt"
    note pytest "FAILED: $(tail -1 "$LOG/pytest.txt")"
  fi
  if [ -f python/bench_modules.py ] && [ $BENCH = 1 ]; then
    BIE_LIBRARY=$PWD/$BUILD/libbie.so PYTHONPATH=$PWD/python timeout 300 python3 python/bench_modules.py \
      2>&1 | tee "$LOG/bench-modules.txt"
    note "bench_modules.py" "exit ${PIPESTATUS[0]}"
  fi
fi

stage "bench results"
grep -E "ratio" "$LOG/bench-cuda.txt" 2>/dev/null
stage "summary"
for l in "${SUMMARY[@]}"; do echo "$l"; done | tee "$LOG/summary.txt"
# Everything in one archive (the device tool brings back at most 8 files).
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu-logs.tgz" -C "$BUILD" logs
  cp "$LOG/summary.txt" "$OUT/" 2>/dev/null
  if [ -f "$LOG/bench-cuda.txt" ]; then cp "$LOG/bench-cuda.txt" "$OUT/"; fi # (none with --no-bench)
fi
# Exit status: 1 when a stage failed or a check did not hold (the summary says which).
for l in "${SUMMARY[@]}"; do
  case "$l" in *FAILED*|*SERIALIZED*|*CHECK:*|*ERRORS*|*"no result"*|*"exit "[1-9]*) exit 1 ;; esac
done
exit 0
