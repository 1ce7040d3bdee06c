#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-cli.sh: the bie program's command line as a user meets it: --opt=value, limits stated as
# they are, outputs checked before any work, checkpoints that go unless kept, --resume that refuses
# changed options and names them, --log's JSON lines, a file that is not safetensors named as such,
# and a bench selection of nothing. Training runs are tiny (--limit) and need the data set.
# Usage: check-cli.sh BIE WORK_DIR
set -u
bie=$1 work=$2
data=/usr/share/datasets/fashion-mnist
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect CODE WORDS -- COMMAND...: the command exits CODE and its stderr contains WORDS.
expect() {
  code=$1 words=$2
  shift 3
  "$@" >out.txt 2>err.txt
  rc=$?
  [ "$rc" -eq "$code" ] || fail "$* exited $rc, not $code: $(cat err.txt)"
  grep -q -- "$words" err.txt || fail "$*: stderr lacks '$words': $(cat err.txt)"
}

expect 2 "is not an integer in 1..65536" -- "$bie" eval x.safetensors --batch=0
expect 2 "is not an integer in 1..65536" -- "$bie" train --batch 70000
expect 2 "is not one of bmlp, bcnn, q4cnn" -- "$bie" train --model=mlp
expect 2 "unknown option '--bogus'" -- "$bie" train --bogus
expect 2 "needs a value" -- "$bie" train --epochs
expect 2 "the directory missing-dir does not exist" -- "$bie" train --out=missing-dir/m.safetensors
expect 2 "--no-checkpoint excludes --resume" -- "$bie" train --no-checkpoint --resume
expect 2 "no checkpoint" -- "$bie" train --resume --out=none.safetensors
expect 2 "no case of" -- "$bie" bench --quick --case=no-such-case
# every kind of the default shapes file parses: a gemv case (the last kind added) runs
"$bie" bench --case=gemv-bin-m1 --repeat=1 --threads=1 >out.txt 2>err.txt ||
  fail "bie bench --case=gemv-bin-m1 exited $?: $(cat err.txt)"
grep -q "gemv-bin-m1" out.txt || fail "bie bench --case=gemv-bin-m1 printed no row: $(cat out.txt)"
printf 'PK\003\004 zip archive bytes' >model.pt
expect 1 "model.pt is not a safetensors file: it is a zip archive" -- "$bie" eval model.pt
expect 1 "is not a safetensors file" -- "$bie" info model.pt

if [ -d "$data" ]; then
  small="--model=bmlp --hidden=32 --epochs=2 --limit=1000 --test-limit=300 --threads=1 --data=$data"
  # shellcheck disable=SC2086
  "$bie" train $small --out=a.safetensors --log=a.jsonl --log-every=4 >/dev/null 2>&1 || fail "train"
  [ -e a.safetensors ] || fail "no model written"
  [ -e a.safetensors.ckpt ] && fail "the checkpoint stayed after a successful run"
  /usr/bin/python3 - a.jsonl <<'PY' || fail "the log is not the JSON lines expected"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
events = [l["event"] for l in lines]
assert events[0] == "start" and events[-1] == "end", events
assert events.count("epoch") == 2 and events.count("step") >= 4, events
assert all(0 <= l["accuracy"] <= 1 and l["loss"] > 0 for l in lines if l["event"] == "step")
PY
  # shellcheck disable=SC2086
  "$bie" train $small --out=b.safetensors --stop-after=1 >/dev/null 2>&1 || fail "train --stop-after"
  [ -e b.safetensors.ckpt ] || fail "no checkpoint after --stop-after"
  expect 2 "--lr: 0.01 given, 0.001 in the checkpoint" -- "$bie" train --resume --out=b.safetensors --lr=0.01
  "$bie" train --resume --out=b.safetensors --threads=1 --data="$data" >/dev/null 2>&1 || fail "train --resume"
  cmp -s a.safetensors b.safetensors || fail "the resumed run's model differs from the uninterrupted run's"
  # shellcheck disable=SC2086
  "$bie" train $small --epochs=1 --out=c.safetensors --keep-checkpoint >/dev/null 2>&1 || fail "--keep-checkpoint"
  [ -e c.safetensors.ckpt ] || fail "--keep-checkpoint did not keep the checkpoint"
  # shellcheck disable=SC2086
  "$bie" train $small --epochs=1 --out=d.safetensors --no-checkpoint >/dev/null 2>&1 || fail "--no-checkpoint"
  [ -e d.safetensors.ckpt ] && fail "--no-checkpoint wrote a checkpoint"
  "$bie" eval a.safetensors --limit=300 --data="$data" >/dev/null 2>&1 || fail "eval"
else
  echo "skipped the training runs: $data is not installed"
fi
[ "$fails" -eq 0 ] || { echo "check-cli: $fails failures"; exit 1; }
echo "check-cli: ok"
