#!/bin/sh
# Runs hora under Slurm on the one-host cluster of ../shared/slurm-local:
# direct launch with `srun` (PMIx) and a batch job with `mpirun` inside,
# and a rank lost under `srun --kill-on-bad-exit=0`; an elastic job under
# `srun --no-kill` losing a rank, with a new step joining it.
# Starts the cluster when it is not running and stops it again at the end.
# Prints one line per check, then "N passed, N failed, N skipped".
#
# usage: tests/slurm/check-slurm.sh BUILDDIR
set -u
builddir=$(cd "${1:-.}" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
. "$builddir/tests/config.sh"
# The shared helpers sit next to the checkout (../shared); HORA_SHARED_DIR
# points elsewhere, and /work/shared is where this project's machines keep them.
slurm_local=
for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared" /work/shared; do
  if [ -n "$d" ] && [ -x "$d/slurm-local/slurm-local.sh" ]; then
    slurm_local="$d/slurm-local/slurm-local.sh"
    break
  fi
done
results=$(mktemp)
work=$(mktemp -d)
started=no
cleanup() {
  [ "$started" = yes ] && "$slurm_local" stop >/dev/null 2>&1
  rm -rf "$work" "$results"
}
trap cleanup EXIT

result() { echo "$*" | tee -a "$results"; }

finish() {
  p=$(grep -c '^PASS' "$results") f=$(grep -c '^FAIL' "$results") s=$(grep -c '^SKIP' "$results")
  [ -n "${HORA_TEST_SUMMARY:-}" ] && echo "$p $f $s" >>"$HORA_TEST_SUMMARY"
  echo "$p passed, $f failed, $s skipped"
  [ "$f" -eq 0 ]
  exit $?
}

if [ "$(id -u)" -ne 0 ] || [ -z "$slurm_local" ]; then
  why="needs root and ../shared/slurm-local (set HORA_SHARED_DIR)"
  for t in srun_direct_np4 srun_direct_np16 srun_without_mpi_np4 srun_without_mpi_collectives_np4 \
           srun_without_mpi_python_np2 sbatch_mpirun_np4 srun_info_line srun_train sbatch_train \
           srun_peer_loss_exit srun_peer_loss_kill srun_peer_loss_segv srun_elastic; do
    result "SKIP slurm/$t: $why"
  done
  finish
fi

if ! sinfo -h >/dev/null 2>&1; then
  "$slurm_local" start >"$work/start.log" 2>&1 || {
    result "FAIL slurm/start: slurm-local.sh start failed"
    tail -n 20 "$work/start.log"
    finish
  }
  started=yes
fi

export OMPI_MCA_mpi_yield_when_idle=1
mpi_plugin=pmix
[ "$MPI_FLAVOR" = mpich ] && mpi_plugin=pmi2
contract="$builddir/tests/mpi/test_contract"

for np in 4 16; do
  # Slurm advertises 16 CPUs on 2 cores, so -O lets 16 tasks share them.
  if timeout 300 srun -O -n $np --mpi=$mpi_plugin "$contract" >"$work/out" 2>&1 &&
     grep -q "^PASS contract/np$np" "$work/out"; then
    result "PASS slurm/srun_direct_np$np"
  else
    result "FAIL slurm/srun_direct_np$np"
    tail -n 20 "$work/out"
  fi
done

# Without MPI: srun starts the tasks and nothing else (--mpi=none); hora
# meets them at a rendezvous on the step's first node, from Slurm's
# variables, and the program never calls MPI.
if timeout 300 srun -O -n 4 --mpi=none "$builddir/tests/launch/init_probe" >"$work/out" 2>&1 &&
   [ "$(grep -c '^init ok: rank [0-3] of 4 via slurm, sum 4' "$work/out")" = 4 ]; then
  result "PASS slurm/srun_without_mpi_np4"
else
  result "FAIL slurm/srun_without_mpi_np4"
  tail -n 20 "$work/out"
fi
mkdir -p "$work/testdir"
if HORA_TEST_DIR="$work/testdir" timeout 300 srun -O -n 4 --mpi=none \
     "$builddir/tests/mpi/test_collectives" >"$work/out" 2>&1 &&
   grep -q "^PASS collectives/ranks_match_launcher" "$work/out" && ! grep -q "^FAIL" "$work/out"; then
  result "PASS slurm/srun_without_mpi_collectives_np4 ($(grep -c '^PASS' "$work/out") checks)"
else
  result "FAIL slurm/srun_without_mpi_collectives_np4"
  grep -v "^PASS" "$work/out" | tail -n 20
fi
py=${HORA_TEST_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch' >/dev/null 2>&1 || { [ -n "$SANITIZERS" ] && [ "$SANITIZERS" != no ]; }; then
  result "SKIP slurm/srun_without_mpi_python_np2: no torch for $py, or a sanitizer build"
elif HORA_LIBRARY="$builddir/.libs/libhora.so.0" PYTHONPATH="$srcdir/python" timeout 300 \
       srun -O -n 2 --mpi=none "$py" -c '
import torch, hora.torch as hvd
hvd.init()
t = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print("python ok: rank %d of %d, mpi_enabled %s, sum %g" % (hvd.rank(), hvd.size(), hvd.mpi_enabled(), t.item()))
' >"$work/out" 2>&1 &&
   [ "$(grep -c '^python ok: rank [01] of 2, mpi_enabled False, sum 3$' "$work/out")" = 2 ]; then
  result "PASS slurm/srun_without_mpi_python_np2"
else
  result "FAIL slurm/srun_without_mpi_python_np2"
  tail -n 20 "$work/out"
fi

cat >"$work/job.sh" <<JOB
#!/bin/sh
#SBATCH -n 4
#SBATCH -o $work/job.out
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
$MPIEXEC "$contract"
echo "mpirun exit \$?"
JOB
jid=$(sbatch --parsable "$work/job.sh" 2>"$work/sbatch.err")
waited=0
while [ -n "$jid" ] && squeue -h -j "$jid" 2>/dev/null | grep -q . && [ $waited -lt 300 ]; do
  sleep 1
  waited=$((waited + 1))
done
if [ -n "$jid" ] && grep -q "^PASS contract/np4" "$work/job.out" 2>/dev/null &&
   grep -q "mpirun exit 0" "$work/job.out"; then
  result "PASS slurm/sbatch_mpirun_np4"
else
  result "FAIL slurm/sbatch_mpirun_np4 (job '${jid:-none}')"
  cat "$work/sbatch.err" "$work/job.out" 2>/dev/null | tail -n 20
fi

# The trainer, launched directly by srun and through the batch template.
if [ -x "$builddir/examples/train" ]; then
  if (cd "$work" && timeout 600 srun -O -n 4 --mpi=$mpi_plugin "$builddir/examples/train" --epochs 1 \
        >"$work/train.out" 2>&1) && grep -q '^test_accuracy=0\.[89]' "$work/train.out"; then
    result "PASS slurm/srun_train ($(grep '^test_accuracy' "$work/train.out"))"
  else
    result "FAIL slurm/srun_train"
    tail -n 20 "$work/train.out"
  fi
  jid=$(cd "$builddir" && sbatch --parsable --output="$work/sbatch-train.out" \
        "$srcdir/scripts/slurm/train.sbatch" --epochs 1 2>"$work/sbatch.err")
  waited=0
  while [ -n "$jid" ] && squeue -h -j "$jid" 2>/dev/null | grep -q . && [ $waited -lt 600 ]; do
    sleep 1
    waited=$((waited + 1))
  done
  rm -f "$builddir/train-$jid.ckpt"
  if [ -n "$jid" ] && grep -q '^test_accuracy=0\.[89]' "$work/sbatch-train.out" 2>/dev/null; then
    result "PASS slurm/sbatch_train (scripts/slurm/train.sbatch, $(grep '^test_accuracy' "$work/sbatch-train.out"))"
  else
    result "FAIL slurm/sbatch_train (job '${jid:-none}')"
    cat "$work/sbatch.err" "$work/sbatch-train.out" 2>/dev/null | tail -n 20
  fi
else
  result "SKIP slurm/srun_train: examples/train was not built"
  result "SKIP slurm/sbatch_train: examples/train was not built"
fi

# Local rank and host index come from MPI, whatever the launcher.
if HORA_LOG_LEVEL=info timeout 120 srun -O -n 2 --mpi=$mpi_plugin "$contract" >"$work/out" 2>&1 &&
   grep -q "rank 1/2 local 1/2 host-index 0/1" "$work/out"; then
  result "PASS slurm/srun_info_line"
else
  result "FAIL slurm/srun_info_line"
  tail -n 20 "$work/out"
fi

# Peer loss under srun told to leave the survivors running: every survivor
# reports the lost rank itself, within seconds.
for mode in exit kill segv; do
  srun -O -n 4 --kill-on-bad-exit=0 --mpi=$mpi_plugin "$builddir/tests/mpi/test_peer_loss" 1 $mode \
    >"$work/loss.out" 2>&1 &
  spid=$!
  for i in $(seq 1 600); do
    [ "$(grep -c '^\(PASS\|FAIL\) peer_loss' "$work/loss.out")" -ge 3 ] && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.1
  done
  kill -INT $spid 2>/dev/null; sleep 0.3; kill -INT $spid 2>/dev/null # srun: two ^C end the step
  sleep 1
  kill -KILL $spid 2>/dev/null
  wait $spid 2>/dev/null
  got=$(grep -c '^PASS peer_loss/[a-z]*/victim1/rank[0-9]* ' "$work/loss.out")
  if [ "$got" -eq 3 ] && ! grep -q '^FAIL' "$work/loss.out"; then
    result "PASS slurm/srun_peer_loss_$mode (survivors' errors $(grep -o 'after [0-9.]* s' "$work/loss.out" | tr '\n' ' ')after the loss)"
  else
    result "FAIL slurm/srun_peer_loss_$mode: $got of 3 survivors reported the loss"
    tail -n 20 "$work/loss.out"
  fi
done
# Elastic: 4 tasks under srun told to keep the others, one killed; a new
# step of the same allocation (srun --overlap -n 1, nothing else set) joins
# at a commit. The 3 survivors and the newcomer end as 4 ranks.
(umask 077 && echo "the elastic job's secret" >"$work/secret")
cat >"$work/elastic.sh" <<EOF
#!/bin/sh
export HORA_ELASTIC=1 HORA_TEST_STEP_MS=10 HORA_ELASTIC_TIMEOUT_SECONDS=20
export HORA_SECRET_FILE="$work/secret"
HORA_TEST_KILL=200:1 srun --no-kill --kill-on-bad-exit=0 --wait=0 --mpi=none -n 4 -l \\
  "$builddir/tests/launch/elastic_probe" 300 10 >"$work/el.job" 2>&1 &
sleep 1.5
srun --overlap -n 1 --mpi=none "$builddir/tests/launch/elastic_probe" 300 10 >"$work/el.new" 2>&1
wait
EOF
chmod +x "$work/elastic.sh"
timeout 240 salloc -O -n 5 "$work/elastic.sh" >"$work/el.salloc" 2>&1
if [ "$(grep -c 'size 4 resets 2 step 300$' "$work/el.job")" = 3 ] &&
   grep -q 'size 4 resets 1 step 300$' "$work/el.new"; then
  result "PASS slurm/srun_elastic (3 survivors of a SIGKILL and a new step ended as 4 ranks)"
else
  result "FAIL slurm/srun_elastic"
  tail -n 15 "$work/el.job" "$work/el.new" "$work/el.salloc"
fi
finish
