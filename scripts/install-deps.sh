#!/usr/bin/env bash
# Installs the Debian packages bie needs to build, test and run its demo, when they are missing.
# Usage: scripts/install-deps.sh [build|test|demo]
set -euo pipefail
what=${1:-build}
pkgs=(build-essential cmake pkg-config libopenblas-dev zlib1g-dev)
case "$what" in
  test) pkgs+=(clang clang-format libclang-rt-14-dev libomp-dev python3 python3-pytest python3-numpy python3-torch python3-hypothesis
               python3-venv python3-pip dataset-fashion-mnist) ;;
  demo) pkgs+=(dataset-fashion-mnist python3 python3-matplotlib) ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
