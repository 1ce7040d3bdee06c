#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-check.sh: everything that needs a GPU, in one go, on a machine with an NVIDIA GPU and the CUDA
# toolkit: a Release build with the CUDA backend, the machine-code check (binary AND-popcount and
# int8 tensor-core instructions present; no emulated XOR-popcount or int4 MMA on sm_90), the unit
# and CUDA tests, compute-sanitizer memcheck on the CUDA tests, the CUDA benchmarks and, when they
# exist, the PyTorch binding's tests and module benchmarks. Prints one summary table last.
# Every stage's log goes to build-gpu/logs. Exits 1 when a stage failed.
#
# Usage: scripts/gpu-check.sh [--out DIR] [--prebuilt DIR] [--quick] [--no-bench] [--no-sanitizer] [--no-python]
#                             [--no-unit] [--no-networks] [--profile]
#   --out DIR: where the results go (default build-gpu/logs): summary.txt, the benchmarks' JSON rows
#     (bench-cuda.json from bie_bench_cuda --json, bench-modules.json from python/bench_modules.py
#     --json: copy them into bench/results/ and run `make perf-doc`), ncu-summary.txt with --profile,
#     and, when DIR is not build-gpu/logs itself, logs.tgz (all of build-gpu/logs)
#   --prebuilt DIR: use the libbie.so, bie_bench_cuda and tests/ programs built in DIR (a CUDA build
#     made elsewhere, e.g. unpacked from an archive) instead of building: no build, no SASS check;
#     the test programs run one by one instead of through ctest
#   --bench-case S: only the CUDA benchmark rows whose group or name contains S (bie_bench_cuda --case)
#   --no-networks: skip python/bench_networks.py (whole ResNet-18 BNNs against fp16 PyTorch,
#     eager and in CUDA graphs; results bench-networks*.json)
#   --profile: also profile the kernels behind each benchmark target with Nsight Compute
#     (scripts/gpu-profile.sh: time, tensor-pipe use, throughput and warp stalls per kernel)
set -u
QUICK=0 BENCH=1 SAN=1 PY=1 PROF=0 NET=1 LABELS="unit cuda" TARGETS="" PREBUILT= BCASE=
BUILD=build-gpu
LOG=$BUILD/logs
DEST=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "gpu-check: --out needs a folder"; exit 2; }; DEST=$2; shift ;;
    --out=*) DEST=${1#--out=} ;;
    --quick) QUICK=1 ;;
    --no-bench) BENCH=0 ;;
    --no-sanitizer) SAN=0 ;;
    --no-python) PY=0 ;;
    --profile) PROF=1 ;;
    --no-networks) NET=0 ;;
    --bench-case) [ $# -ge 2 ] || { echo "gpu-check: --bench-case needs a name"; exit 2; }; BCASE=$2; shift ;;
    --prebuilt) [ $# -ge 2 ] || { echo "gpu-check: --prebuilt needs a folder"; exit 2; }; PREBUILT=$2; shift ;;
    --no-unit) LABELS=cuda TARGETS="--target cuda_test-cuda-layer-forward cuda_test-cuda-layer-backward cuda_test-cuda-pack bie_bench_cuda bie bie_cuda bie_cli" ;;
    *) echo "gpu-check: unknown option $1 (see the usage at the top of $0)"; exit 2 ;;
  esac
  shift
done
case "$DEST" in "" | /*) ;; *) DEST=$PWD/$DEST ;; esac # (relative to where the script was called from)
cd "$(dirname "$0")/.."
if [ -n "$PREBUILT" ]; then BUILD=$PREBUILT; LOG=$BUILD/logs; fi
DEST=${DEST:-$LOG}
rm -rf "$LOG"
mkdir -p "$LOG" "$DEST" || exit 2
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
if [ -n "$PREBUILT" ]; then
  note build "prebuilt ($BUILD)"
  touch "$LOG/build.txt"
elif cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DBIE_CUDA=ON >"$LOG/cmake.txt" 2>&1 &&
   cmake --build $BUILD -j"$JOBS" $TARGETS -- -k >"$LOG/build.txt" 2>&1; then
  note build "ok ($(( $(date +%s) - t0 )) s)"
else
  # keep going: other targets may still have built (the log names what failed)
  grep -E "error|Error" "$LOG/build.txt" | head -20
  note build "FAILED in part (see build.txt); continuing with what built"
fi

# ptxas serialises warpgroup MMAs it cannot prove uniform (C7520): a silent loss of speed.
if grep -q "C7520" "$LOG/build.txt"; then
  note "wgmma pipelining" "SERIALIZED in $(grep -c C7520 "$LOG/build.txt") kernels (ptxas C7520, see build.txt)"
else note "wgmma pipelining" "ok (no ptxas C7520)"; fi

stage "machine code (sm_90a)"
SASS="$LOG/sass-counts.txt"
: >"$SASS"
mkdir -p "$LOG/sass"
for o in $BUILD/CMakeFiles/bie_cuda_objects.dir/src/cuda/*.o; do
  [ -f "$o" ] || continue
  cuobjdump -sass -arch sm_90a "$o" 2>/dev/null >"$LOG/sass/$(basename "$o").sass" || true
done
cat "$LOG"/sass/*.o.sass 2>/dev/null | grep -oE "\b(BMMA|IMMA|HMMA|BGMMA|IGMMA)[A-Za-z0-9_.]*" | sort | uniq -c | tee "$SASS"
bmma=$(grep -c "BMMA.*AND" "$SASS" || true)
bgmma=$(grep -c "BGMMA.*AND" "$SASS" || true)
igmma=$(grep -c "IGMMA" "$SASS" || true)
xor=$(cat "$LOG"/sass/*.o.sass 2>/dev/null | grep -cE "BMMA[^ ]*XOR|IMMA[^ ]*S4|IMMA[^ ]*U4" || true)
if [ "${bmma:-0}" -gt 0 ] && [ "${bgmma:-0}" -gt 0 ] && [ "${igmma:-0}" -gt 0 ] && [ "${xor:-0}" -eq 0 ]; then
  note "sass" "BMMA.AND, BGMMA.AND and IGMMA present, no XOR/S4 MMA"
else note "sass" "CHECK: BMMA.AND=$bmma BGMMA.AND=$bgmma IGMMA=$igmma XOR/S4=$xor"; fi

stage "tests (unit + cuda)"
if [ -n "$PREBUILT" ]; then # the programs one by one (ctest's files name the build's own paths)
  for t in "$BUILD"/tests/cuda_test-* "$BUILD"/tests/test-*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    if timeout 600 "$t" >"$LOG/$n.txt" 2>&1; then note "$n" "$(tail -1 "$LOG/$n.txt")"
    else tail -20 "$LOG/$n.txt"; note "$n" "FAILED: $(tail -1 "$LOG/$n.txt")"; fi
  done
  LABELS=""
fi
for label in $LABELS; do
  if ctest --test-dir $BUILD -L $label --output-on-failure -j4 --timeout 600 >"$LOG/ctest-$label.txt" 2>&1; then
    note "ctest -L $label" "$(grep -E 'tests passed' "$LOG/ctest-$label.txt" | tail -1)"
  else
    tail -40 "$LOG/ctest-$label.txt"
    note "ctest -L $label" "FAILED: $(grep -E 'tests passed|tests failed' "$LOG/ctest-$label.txt" | tail -1)"
  fi
done
grep -h -E "FAIL|skipped" $BUILD/Testing/Temporary/LastTest.log 2>/dev/null | head -40
# The layer tests again with one setting changed: layers_with NAME LOGFILE VAR=VALUE PROGRAM...
# (the programs that are built run one after the other into LOGFILE; one summary line).
layers_with() {
  local name=$1 log=$LOG/$2 setting=$3 t ok=1 ran=0
  shift 3
  : >"$log"
  for t in "$@"; do
    [ -x "$BUILD/tests/cuda_$t" ] || continue
    ran=1
    env "$setting" timeout 300 "$BUILD/tests/cuda_$t" >>"$log" 2>&1 || ok=0
  done
  [ $ran = 1 ] || return 0
  if [ $ok = 1 ]; then note "$name" "$(tail -1 "$log")"
  else tail -20 "$log"; note "$name" "FAILED ($(basename "$log"))"; fi
}
# The conv backward's GEMM route (cuDNN's is the default) through the layer backward tests.
layers_with "layers, GEMM conv backward" cuda-layers-gemm.txt BIE_CUDA_CONV_BACKWARD=gemm test-cuda-layer-backward
# The layer tests again on the mma.sync GEMM (the sm_80 path; Hopper uses wgmma by default).
layers_with "layers on mma.sync" cuda-layers-mma.txt BIE_CUDA_GEMM=mma test-cuda-layer-forward test-cuda-layer-backward

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
    # racecheck does not follow the mbarrier and TMA ordering of cuDNN's Hopper kernels (it reports
    # hazards inside them whose results are right): it checks bie's own kernels, the conv backward
    # on its GEMM route
    route=
    [ $tool = racecheck ] && route=gemm
    if ! BIE_CUDA_CONV_BACKWARD=$route timeout 1500 compute-sanitizer --tool $tool --error-exitcode 9 \
         $BUILD/fuzz-layers-cuda --runs $n --seed 1 \
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
  # One JSON object per row (the input of scripts/perf-report.py), shown as a table as it goes.
  if [ -x $BUILD/bie_bench_cuda ]; then
    timeout 500 $BUILD/bie_bench_cuda --json $BQ ${BCASE:+--case "$BCASE"} 2>"$LOG/bench-cuda.err" |
      tee "$LOG/bench-cuda.json"
    python3 scripts/perf-report.py --table "$LOG/bench-cuda.json" | tee "$LOG/bench-cuda.txt"
  fi
  if grep -q '"speedup"' "$LOG/bench-cuda.json" 2>/dev/null; then note bench "ok (bench-cuda.json)"
  else tail -5 "$LOG/bench-cuda.err" 2>/dev/null; note bench "no result"; fi
fi

if [ $PROF = 1 ]; then
  stage "profiles of the benchmark targets' kernels (ncu)"
  scripts/gpu-profile.sh --build $BUILD --out "$LOG" && note profiles "ok (ncu-summary.txt)" || note profiles "FAILED (ncu-*.err)"
fi

if [ -d python/tests ] && [ $PY = 1 ]; then
  stage "python binding"
  # libbie opens its CUDA plugin (libbie-cuda.so beside it): say so, or why not, before the tests
  # (which skip their CUDA cases without it).
  BIE_LIBRARY=$PWD/$BUILD/libbie.so PYTHONPATH=$PWD/python python3 -c \
    "import bie; r = bie.cuda_unavailable_reason(); print('CUDA backend:', r or 'available'); exit(1 if r else 0)" \
    && note "cuda plugin" "loaded" || note "cuda plugin" "NOT AVAILABLE (see above)"
  if BIE_LIBRARY=$PWD/$BUILD/libbie.so PYTHONPATH=$PWD/python timeout 300 python3 -m pytest -q python/tests \
       >"$LOG/pytest.txt" 2>&1; then
    note pytest "$(tail -1 "$LOG/pytest.txt")"
  else
    tail -30 "$LOG/pytest.txt"
    note pytest "FAILED: $(tail -1 "$LOG/pytest.txt")"
  fi
  if [ -f python/bench_modules.py ] && [ $BENCH = 1 ]; then
    BIE_LIBRARY=$PWD/$BUILD/libbie.so PYTHONPATH=$PWD/python timeout 300 python3 python/bench_modules.py --json \
      2>"$LOG/bench-modules.err" | tee "$LOG/bench-modules.json"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || tail -20 "$LOG/bench-modules.err"
    note "bench_modules.py" "exit $rc"
    python3 scripts/perf-report.py --table "$LOG/bench-modules.json" >"$LOG/bench-modules.txt"
  fi
fi

if [ $NET = 1 ] && [ $PY = 1 ] && [ -f python/bench_networks.py ]; then
  stage "whole networks (ResNet-18 BNN against fp16 PyTorch)"
  for mode in eager graphs; do
    flag=""
    [ $mode = graphs ] && flag="--graphs --batch 16"
    [ $QUICK = 1 ] && flag="$flag --batch 16 --budget 0.5"
    if BIE_LIBRARY=$PWD/$BUILD/libbie.so PYTHONPATH=$PWD/python timeout 500 python3 python/bench_networks.py $flag \
         --json "$LOG/bench-networks-$mode.json" >"$LOG/bench-networks-$mode.txt" 2>&1; then
      note "networks ($mode)" "ok (bench-networks-$mode.json)"
    else
      note "networks ($mode)" "FAILED (bench-networks-$mode.txt)"
    fi
    cat "$LOG/bench-networks-$mode.txt"
  done
fi

stage "bench results"
cat "$LOG/bench-cuda.txt" "$LOG/bench-modules.txt" "$LOG"/bench-networks-*.txt 2>/dev/null
stage "summary"
for l in "${SUMMARY[@]}"; do echo "$l"; done | tee "$LOG/summary.txt"
# The results beside the logs, or copied to --out with all the logs in one archive.
if [ "$(cd "$DEST" && pwd -P)" != "$(cd "$LOG" && pwd -P)" ]; then
  for f in summary.txt bench-cuda.json bench-modules.json bench-networks-eager.json bench-networks-graphs.json \
           ncu-summary.txt; do
    if [ -f "$LOG/$f" ]; then cp "$LOG/$f" "$DEST/"; fi
  done
  tar czf "$DEST/logs.tgz" -C "$BUILD" logs
  echo "results in $DEST: $(cd "$DEST" && ls | tr '\n' ' ')"
fi
# Exit status: 1 when a stage failed or a check did not hold (the summary says which).
for l in "${SUMMARY[@]}"; do
  case "$l" in *FAILED*|*SERIALIZED*|*CHECK:*|*ERRORS*|*"no result"*|*"exit "[1-9]*) exit 1 ;; esac
done
exit 0
