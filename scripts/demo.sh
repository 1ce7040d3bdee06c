#!/usr/bin/env bash
# The main job: train a binary CNN on Fashion-MNIST with the bie program, then evaluate the
# exported packed model from the file alone (accuracy, and speed against float layers) and print
# its layers and size. Run by `make demo` after the build; the model goes to build/demo/ (or to
# the folder BIE_DEMO_DIR names).
# Options for `bie train` can be passed through: scripts/demo.sh --epochs 2
set -euo pipefail
cd "$(dirname "$0")/.."
BIE=${BIE:-build/bie}
DIR=${BIE_DEMO_DIR:-build/demo}
mkdir -p "$DIR"
start=$(date +%s)
"$BIE" train --model bcnn --out "$DIR/bcnn.safetensors" --checkpoint "$DIR/bcnn.ckpt.safetensors" "$@"
"$BIE" eval "$DIR/bcnn.safetensors" --compare-float
"$BIE" info "$DIR/bcnn.safetensors"
echo "demo finished in $(( $(date +%s) - start )) s"
