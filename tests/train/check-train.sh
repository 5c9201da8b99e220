#!/bin/sh
# The example trainer: equal loss curves for np=1 with batch 4B and np=4
# with batch B; resume from a checkpoint; gradient accumulation with fp16
# allreduce; and accuracy runs. Prints PASS/FAIL/SKIP lines.
# usage: check-train.sh BUILDDIR [quick]   (quick: no accuracy runs, for
#        sanitizer builds, where a full training takes too long)
set -u
builddir=$(cd "$1" && pwd)
quick=${2:-}
. "$builddir/tests/config.sh"
train="$builddir/examples/train"
if [ ! -x "$train" ]; then
  echo "SKIP train/all: examples/train was not built (configure found no OpenBLAS or zlib)"
  exit 0
fi
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP train/all: Fashion-MNIST is not installed (scripts/install-deps.sh)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=
[ "$MPI_FLAVOR" = openmpi ] && flags="--oversubscribe --bind-to none"
[ "$MPI_FLAVOR" = openmpi ] && [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"

run() { # np output-file args...
  np=$1 out=$2
  shift 2
  timeout -k 10 600 "$MPIEXEC" $flags -np "$np" "$train" "$@" </dev/null >"$out" 2>&1
}

# 1. Equivalence: the same global batches and learning rate, split 1 or 4 ways.
run 1 "$work/np1" --batch 128 --lr 0.08 --max-steps 50 --print-steps 50 --checkpoint "$work/a.ckpt"
run 4 "$work/np4" --batch 32 --lr 0.02 --max-steps 50 --print-steps 50 --checkpoint "$work/b.ckpt"
grep '^step' "$work/np1" >"$work/s1"
grep '^step' "$work/np4" >"$work/s4"
diff=$(paste "$work/s1" "$work/s4" | awk '{d = $4 - $8; if (d < 0) d = -d; r = d / $4; if (r > m) m = r} END {if (NR == 50) printf "%.3g", m; else print "missing"}')
if [ "$diff" != missing ] && awk -v d="$diff" 'BEGIN {exit !(d < 1e-4)}'; then
  echo "PASS train/np1_batch4B_equals_np4_batchB (max relative loss difference $diff over 50 steps)"
else
  echo "FAIL train/np1_batch4B_equals_np4_batchB (max relative loss difference $diff)"
  tail -n 5 "$work/np1" "$work/np4"
fi

# 2. Resume: one epoch, then a second from the checkpoint.
if [ -n "$quick" ]; then
  echo "SKIP train/resume: quick mode (two epochs of training; the plain build runs it)"
else
run 2 "$work/first" --epochs 1 --checkpoint "$work/r.ckpt"
run 2 "$work/second" --epochs 2 --resume --checkpoint "$work/r.ckpt"
if grep -q '^resumed from .* at epoch 2' "$work/second" && grep -q '^epoch 2 ' "$work/second" &&
   ! grep -q '^epoch 1 ' "$work/second" && grep -q '^test_accuracy=0\.[89]' "$work/second"; then
  echo "PASS train/resume ($(grep '^test_accuracy' "$work/first") after 1, $(grep '^test_accuracy' "$work/second") after 2 epochs)"
else
  echo "FAIL train/resume"
  tail -n 5 "$work/first" "$work/second"
fi
fi

# 3. Accumulation over 4 micro-batches with fp16 gradients: it still learns.
run 2 "$work/accum" --accum-steps 4 --fp16-allreduce --max-steps 60 --print-steps 60 --warmup-steps 10 \
  --checkpoint "$work/c.ckpt"
first=$(grep '^step 1 ' "$work/accum" | awk '{print $4}')
last=$(grep '^step 60 ' "$work/accum" | awk '{print $4}')
if [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a / 3)}'; then
  echo "PASS train/accum4_fp16_learns (loss $first -> $last in 60 steps)"
else
  echo "FAIL train/accum4_fp16_learns (loss '$first' -> '$last')"
  tail -n 5 "$work/accum"
fi

# 4. Accuracy with the defaults (the example trainer's table in docs/getting-started.md, 16 ranks).
nps="16"
[ -n "$quick" ] && nps=
for np in $nps; do
  start=$(date +%s)
  run "$np" "$work/full$np" --checkpoint "$work/full$np.ckpt"
  rc=$?
  secs=$(($(date +%s) - start))
  acc=$(sed -n 's/^test_accuracy=//p' "$work/full$np")
  if [ $rc -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" 'BEGIN {exit !(a >= 0.85)}'; then
    echo "PASS train/np${np}_defaults (test_accuracy=$acc in ${secs}s)"
  else
    echo "FAIL train/np${np}_defaults (exit $rc, test_accuracy='$acc')"
    tail -n 8 "$work/full$np"
  fi
done
