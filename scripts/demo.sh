#!/usr/bin/env bash
# The main job: train a binary network on Fashion-MNIST with the bie program, then evaluate the
# exported packed model. (Filled in by the "Main job" work; until then it runs the layer tests.)
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build -L unit --output-on-failure
