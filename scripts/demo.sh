#!/usr/bin/env bash
# The main job: train a binary CNN on Fashion-MNIST with the bie program, then evaluate the
# exported packed model from the file alone (accuracy, and speed against float layers), print its
# layers and size, and draw the training curves from the run's log (build/demo/bcnn.png). Run by
# `make demo` after the build; everything goes to build/demo/.
# Options for `bie train` can be passed through: scripts/demo.sh --epochs 2
set -euo pipefail
cd "$(dirname "$0")/.."
BIE=${BIE:-build/bie}
OUT=${OUT:-build/demo}
mkdir -p "$OUT"
start=$(date +%s)
"$BIE" train --model bcnn --out "$OUT/bcnn.safetensors" --checkpoint "$OUT/bcnn.ckpt.safetensors" \
  --log "$OUT/bcnn.jsonl" "$@"
"$BIE" eval "$OUT/bcnn.safetensors" --compare-float
"$BIE" info "$OUT/bcnn.safetensors"
/usr/bin/python3 scripts/plot-training.py "$OUT/bcnn.jsonl" -o "$OUT/bcnn.png"
echo "demo finished in $(( $(date +%s) - start )) s"
