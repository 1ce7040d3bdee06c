#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ddp-check.sh: the ResNet-18 BNN trained with PyTorch DistributedDataParallel over every GPU of
# this machine (python/bench_ddp.py through torchrun, one process per GPU, NCCL): the first float32
# step against one-GPU training (beside the spread rounding alone gives it), and the step's scaling
# over one GPU.
# Usage: scripts/ddp-check.sh [--out DIR] [bench_ddp.py options]   (BIE_LIBRARY: the libbie to use)
set -eu
OUT_DIR=build-gpu/logs
if [ "${1:-}" = "--out" ]; then OUT_DIR=$2; shift 2; fi
cd "$(dirname "$0")/.."
mkdir -p "$OUT_DIR"
GPUS=$(nvidia-smi -L | wc -l)
[ "$GPUS" -ge 2 ] || { echo "ddp-check: needs at least 2 GPUs, this machine has $GPUS"; exit 2; }
export BIE_LIBRARY=${BIE_LIBRARY:-$PWD/build/libbie.so} PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
# NVLink multicast off (NCCL's NVLS): it is not needed for an all-reduce of gradients
export NCCL_NVLS_ENABLE=0
python3 -m torch.distributed.run --standalone --nproc_per_node="$GPUS" python/bench_ddp.py \
  --json "$OUT_DIR/bench-ddp.json" "$@"
