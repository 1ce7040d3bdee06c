#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-libbie.sh: libbie and the bie program load and work on a machine without CUDA.
#   1. Neither libbie.so nor bie needs a CUDA library (no NEEDED entry, nothing CUDA in ldd's list).
#   2. With libbie copied alone to a directory (no plugin beside it) that is the loader's only
#      extra path, test-plugin finds CUDA absent for the reason "not installed", and `bie` trains
#      and evaluates a small model on the CPU through that copy (when the data set is installed).
# Usage: check-libbie.sh LIBBIE BIE TEST_PLUGIN WORKDIR
set -eu
lib=$1 bie=$2 test_plugin=$3 work=$4
cuda='^lib(cuda|cublas|cudnn|cufft|curand|cusparse|cusolver|nvrtc|nvjitlink|nvidia)'
for f in "$lib" "$bie"; do
  if readelf -d "$f" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | grep -Ei "$cuda"; then
    echo "FAIL: $f needs a CUDA library"; exit 1
  fi
  if ldd "$f" | awk '{print $1}' | grep -Ei "$cuda"; then echo "FAIL: $f loads a CUDA library"; exit 1; fi
done
echo "ok: $(basename "$lib") and $(basename "$bie") need no CUDA library"
rm -rf "$work"
mkdir -p "$work/lib" "$work/out"
cp "$lib" "$work/lib/"
ln -sf "$(basename "$lib")" "$work/lib/libbie.so.0"
export LD_LIBRARY_PATH="$work/lib"
unset BIE_CUDA_PLUGIN
"$test_plugin" "is not installed"
"$bie" version
data=/usr/share/datasets/fashion-mnist
if [ -d "$data" ]; then
  "$bie" train --model=bmlp --hidden=64 --epochs=1 --limit=2000 --test-limit=500 --no-checkpoint \
    --out="$work/out/m.safetensors" --data="$data" >"$work/out/train.txt"
  "$bie" eval "$work/out/m.safetensors" --limit=500 --data="$data"
else
  echo "skipped the training run: $data is not installed"
fi
