#!/usr/bin/env bash
# Fails, naming the files, when a C or CUDA source of src/, include/, tools/, tests/ or bench/ is not
# formatted as .clang-format says (`clang-format -i FILE` formats one). Run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format is not installed (scripts/install-deps.sh test installs it)" >&2
  exit 1
fi
mapfile -t files < <(find src include tools tests bench \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: not formatted as .clang-format says (clang-format -i fixes them): ${bad[*]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
