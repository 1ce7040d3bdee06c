#!/usr/bin/env bash
# The main job: train a binary CNN on Fashion-MNIST with the bie program, then evaluate the
# exported packed model from the file alone (accuracy, and speed against float layers), print its
# layers and size, and draw the training curves from the run's log (bcnn.png). Run by `make demo`
# after the build; everything goes to build/demo/ (or to the folder BIE_DEMO_DIR names).
# Options for `bie train` can be passed through: scripts/demo.sh --epochs 2
set -euo pipefail
cd "$(dirname "$0")/.."
BIE=${BIE:-build/bie}
DIR=${BIE_DEMO_DIR:-build/demo}
mkdir -p "$DIR"
start=$(date +%s)
"$BIE" train --model bcnn --out "$DIR/bcnn.safetensors" --checkpoint "$DIR/bcnn.ckpt.safetensors" \
  --log "$DIR/bcnn.jsonl" "$@"
"$BIE" eval "$DIR/bcnn.safetensors" --compare-float
"$BIE" info "$DIR/bcnn.safetensors"
/usr/bin/python3 scripts/plot-training.py "$DIR/bcnn.jsonl" -o "$DIR/bcnn.png"
echo "demo finished in $(( $(date +%s) - start )) s"
