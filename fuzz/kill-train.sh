#!/usr/bin/env bash
# kill-train.sh BIE KILLS [WORK]: crash safety of `bie train` under kill -9.
#
# Trains a small model on the first 2000 Fashion-MNIST images for 6 epochs (a checkpoint after each)
# and kills it with SIGKILL at a random moment, KILLS times, each time resuming from the checkpoint
# (or starting over when none was written yet). After every kill the checkpoint, when there is one,
# must load (`bie info`); the training then runs to its end with --resume, and:
# - the final packed model is byte-identical to an uninterrupted run's;
# - no temporary file (<file>.tmp.*) is left: the next write of a file removes those of killed
#   writers;
# Prints the counts; exit 1 on any failure. Needs the Fashion-MNIST IDX files (install-deps test).
set -u
bie=$(readlink -f "$1")
kills=${2:-20}
work=${3:-$(mktemp -d)}
data=/usr/share/datasets/fashion-mnist
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
  echo "kill-train: no data in $data, skipped"
  exit 0
fi
rm -rf "$work"
mkdir -p "$work"
common=(--model bmlp --hidden 512 --epochs 6 --limit 2000 --test-limit 500 --threads 1 --seed 3 --data "$data")
"$bie" train "${common[@]}" --out "$work/ref.safetensors" >/dev/null 2>&1 || { echo "kill-train: the reference run failed"; exit 1; }
out=$work/model.safetensors
ckpt=$out.ckpt
corrupt=0 killed=0 completed=0 differ=0
for ((i = 0; killed < kills && i < 4 * kills; i++)); do
  args=("${common[@]}" --out "$out")
  [ -f "$ckpt" ] && args+=(--resume)
  "$bie" train "${args[@]}" >"$work/log" 2>&1 &
  pid=$!
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.05 + r / 32768 * 2.0 }')"
  if kill -9 "$pid" 2>/dev/null; then
    killed=$((killed + 1))
    wait "$pid" 2>/dev/null
  elif wait "$pid"; then # it finished first: its model must be the uninterrupted run's; start over
    completed=$((completed + 1))
    cmp -s "$out" "$work/ref.safetensors" || differ=$((differ + 1))
    rm -f "$out" "$ckpt"
    continue
  fi
  if [ -f "$ckpt" ] && ! "$bie" info "$ckpt" >/dev/null 2>&1; then
    corrupt=$((corrupt + 1))
    echo "kill-train: the checkpoint does not load after kill $killed"
    rm -f "$ckpt"
  fi
done
temps_after_kills=$(ls "$work" | grep -c '\.tmp\.')
args=("${common[@]}" --out "$out")
[ -f "$ckpt" ] && args+=(--resume)
"$bie" train "${args[@]}" >"$work/log" 2>&1 || { echo "kill-train: the final resumed run failed"; tail -3 "$work/log"; exit 1; }
temps=$(ls "$work" | grep -c '\.tmp\.')
same=no
cmp -s "$out" "$work/ref.safetensors" && same=yes
echo "kill-train: $killed kills survived ($completed runs finished between them, $differ of them different)," \
     "$corrupt corrupt checkpoints, $temps_after_kills temporary files after the kills, $temps after the final run," \
     "final model identical to an uninterrupted run: $same"
[ "$corrupt" -eq 0 ] && [ "$temps" -eq 0 ] && [ "$same" = yes ] && [ "$differ" -eq 0 ]
