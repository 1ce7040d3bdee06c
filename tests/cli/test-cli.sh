#!/usr/bin/env bash
# test-cli.sh BIE: the bie program on hostile input, through its public behaviour (exit codes,
# messages, no signal):
# - `bie bench` shape files with s=0 (was SIGFPE), M=2^62 (overflow), M=-5 ("out of memory"),
#   junk values and unknown kinds: exit 2 with a message naming the line;
# - a file size limit (ulimit -f) reached while saving: exit 1 with a message, not SIGXFSZ.
set -u
bie=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check WANT_RC PATTERN -- command...
  local want=$1 pattern=$2
  shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ] || { [ -n "$pattern" ] && ! grep -q -- "$pattern" "$tmp/err"; }; then
    echo "FAIL: $* -> exit $rc (want $want), stderr: $(head -c 300 "$tmp/err")"
    fail=$((fail + 1))
  fi
}
lines=(
  "conv c quant=1 B=1 C=8 H=8 W=8 O=8 k=3 s=0 p=1|k and s"
  "linear l quant=1 M=4611686018427387904 K=8 N=8|M, N and K"
  "linear l quant=1 M=-5 K=8 N=8|M, N and K"
  "linear l quant=1 M=99999999999999999999999 K=8 N=8|not an integer"
  "linear l quant=1 M=12x K=8 N=8|not an integer"
  "linear l quant=3 M=8 K=8 N=8|quant"
  "gemm g quant=4 M=8 K=8 N=8|binary"
  "conv c quant=1 B=1 C=8 H=2 W=2 O=8 k=9 s=1 p=0|kernel"
  "conv c quant=1 B=1048576 C=1048576 H=8 W=8 O=8 k=3|2^31"
  "linear l quant=1 M=1048576 K=1048576 N=8|2^31"
  "matmul m quant=1 M=8 K=8 N=8|kind"
  "linear l quant=1 M=8 K=8 N=8 Q=3|unknown key"
  "linear l quant=1 M=8 K=8 N=8 junk|key=value"
)
for entry in "${lines[@]}"; do
  printf '%s\n' "${entry%|*}" >"$tmp/shapes.txt"
  check 2 "${entry#*|}" -- "$bie" bench --shapes "$tmp/shapes.txt" --threads 1 --repeat 1
done
# A valid tiny case still runs.
printf 'linear ok quant=1 M=4 K=16 N=8\n' >"$tmp/shapes.txt"
check 0 "" -- "$bie" bench --shapes "$tmp/shapes.txt" --threads 1 --repeat 1

# ulimit -f: the packed model (tens of KB) does not fit in 8 KiB.
data=/usr/share/datasets/fashion-mnist
if [ -r "$data/train-images-idx3-ubyte.gz" ]; then
  (ulimit -f 8; exec "$bie" train --model bmlp --hidden 64 --epochs 1 --limit 128 --test-limit 64 --threads 1 \
     --data "$data" --out "$tmp/m.safetensors") >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "file size limit" "$tmp/err"; then
    echo "FAIL: bie train under ulimit -f 8 -> exit $rc (want 1, 153 is SIGXFSZ), stderr: $(tail -c 300 "$tmp/err")"
    fail=$((fail + 1))
  fi
  if ls "$tmp" | grep -q '\.tmp\.'; then
    echo "FAIL: temporary files left: $(ls "$tmp")"
    fail=$((fail + 1))
  fi
else
  echo "skipped the ulimit -f case: no data in $data"
fi
echo "test-cli: $fail failed"
[ "$fail" -eq 0 ]
