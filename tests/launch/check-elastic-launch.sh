#!/bin/sh
# How an elastic job is launched (docs/elastic-launch.md):
#   info    hora-info --elastic, given each launcher's variables, prints that
#           launcher's lines (and only those; every launcher's when none is
#           set), with the rendezvous and secret of the environment
#   mpirun  Open MPI's mpirun with the options hora-info prints leaves the
#           three survivors of a SIGKILLed rank running to their end, with
#           and without MPI_Init in them; without the options they are
#           killed, so the options are what keeps them
# One PASS/FAIL/SKIP line per check; exit status 1 when one failed.
#
# usage: tests/launch/check-elastic-launch.sh BUILDDIR
set -u
# Words like SLURM_JOB_NODELIST=n[2-4] go through word splitting: never globs.
set -f
builddir=$(cd "${1:-.}" && pwd)
. "$builddir/tests/config.sh"
info="$builddir/hora-info"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only what each check sets decides the launcher.
for v in $(env | grep -E '^(OMPI_COMM_|PMIX?_|SLURM_|MASTER_|HORA_)[A-Za-z0-9_]*=' | cut -d= -f1); do
  unset "$v"
done
unset RANK WORLD_SIZE MPI_LOCALNRANKS
failed=0

fail() {
  echo "FAIL $*"
  failed=1
}

# expect NAME VARS PATTERN...: hora-info --elastic with the variables VARS
# (words VAR=VALUE) prints a line matching each PATTERN (grep -E), and none
# matching a PATTERN written !PATTERN.
expect() {
  name=$1 vars=$2
  shift 2
  # shellcheck disable=SC2086
  env $vars "$info" --elastic >"$work/info" 2>&1
  rc=$?
  bad=""
  [ $rc -eq 0 ] || bad=" exit status $rc;"
  for p in "$@"; do
    case "$p" in
      !*) grep -Eq -- "${p#!}" "$work/info" && bad="$bad has '${p#!}';" ;;
      *) grep -Eq -- "$p" "$work/info" || bad="$bad lacks '$p';" ;;
    esac
  done
  if [ -z "$bad" ]; then
    echo "PASS elastic-launch/info_$name"
  else
    fail "elastic-launch/info_$name:$bad"
    sed 's/^/    /' "$work/info"
  fi
}

ompi_launch='^  launch:   mpirun --enable-recovery -x HORA_ELASTIC=1 -x HORA_RENDEZVOUS='
srun_launch='^  launch:   HORA_ELASTIC=1 srun --no-kill --kill-on-bad-exit=0 --wait=0 --mpi=none -n N \./train$'
env_launch='^  launch:   MASTER_ADDR=[^ ]+ MASTER_PORT=[^ ]+ RANK=r WORLD_SIZE=N HORA_ELASTIC=1 '
tcp_launch='^  launch:   HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=[^ ]+ HORA_RANK=r HORA_SIZE=N HORA_ELASTIC=1 '
hydra_launch='^  launch:   none keeps the others'

if [ "${HAVE_MPI:-yes}" = yes ]; then
  expect openmpi "OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1 PMIX_RANK=1" \
    "^elastic launch: mpi start-up, because .*OMPI_COMM_WORLD_SIZE" "${ompi_launch}HOST:PORT -np N \./train$" \
    "^  newcomer: mpirun -np 1 -x HORA_BOOTSTRAP=tcp -x HORA_RENDEZVOUS=HOST:PORT -x HORA_ELASTIC=1 \./train$" \
    "set HORA_RENDEZVOUS=host:port for the job itself" "!srun" "!$tcp_launch" "!$hydra_launch"
  # Under MPI the job's own HORA_RENDEZVOUS is where newcomers go.
  expect openmpi_rendezvous "OMPI_COMM_WORLD_SIZE=4 HORA_RENDEZVOUS=node1:29400" \
    "${ompi_launch}node1:29400 -np N" "^  newcomer: mpirun .*-x HORA_RENDEZVOUS=node1:29400 " \
    "^  rendezvous: HORA_RENDEZVOUS=node1:29400: rank 0 listens there" "!for the job itself"
  expect other_mpi "PMI_RANK=1 PMI_SIZE=4" "another MPI's mpiexec" "$hydra_launch" "$tcp_launch" \
    "!mpirun --enable-recovery -x" "!srun"
  # srun --mpi=pmix: the step is cancelled whatever the options, so --mpi=none.
  expect srun_pmix "PMIX_RANK=0 SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_STEP_ID=0 SLURM_JOB_ID=42 SLURM_JOB_NODELIST=n[2-4] HORA_RENDEZVOUS_PORT=23456" \
    "Slurm cancels the whole" "$srun_launch" "HORA_RENDEZVOUS=n2:23456 .*srun --overlap --jobid=42 -n 1 --mpi=none" \
    "!mpirun --enable-recovery"
else
  expect without_mpi "OMPI_COMM_WORLD_SIZE=4" "!$ompi_launch"
  if grep -q "cannot start here: .*built without MPI" "$work/info"; then
    echo "PASS elastic-launch/info_without_mpi_says_why"
  else
    fail "elastic-launch/info_without_mpi_says_why: $(cat "$work/info")"
  fi
fi

# Slurm: the rendezvous is the allocation's first node (not the step's), at
# a port every step of the job shares, so a later step finds it.
slurm="SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_JOB_ID=42 SLURM_STEP_NODELIST=n[3-4] SLURM_JOB_NODELIST=n[2-4]"
expect slurm "$slurm SLURM_STEP_ID=0 HORA_RENDEZVOUS_PORT=23456" "^elastic launch: slurm start-up" "$srun_launch" \
  "^  newcomer: HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=n2:23456 HORA_ELASTIC=1 srun --overlap --jobid=42 -n 1 --mpi=none \./train$" \
  "!mpirun" "!$env_launch"
# shellcheck disable=SC2086
step0=$(env $slurm SLURM_STEP_ID=0 "$info" --elastic | grep '^  newcomer:')
# shellcheck disable=SC2086
step3=$(env $slurm SLURM_STEP_ID=3 "$info" --elastic | grep '^  newcomer:')
if [ -n "$step0" ] && [ "$step0" = "$step3" ] && echo "$step0" | grep -q "HORA_RENDEZVOUS=n2:[0-9]"; then
  echo "PASS elastic-launch/info_slurm_steps_share_the_rendezvous"
else
  fail "elastic-launch/info_slurm_steps_share_the_rendezvous: step 0 '$step0', step 3 '$step3'"
fi
# In the allocation's own shell (sbatch's script: no step yet) the same.
alloc=$(env SLURM_JOB_ID=42 SLURM_JOB_NODELIST="n[2-4]" SLURM_NTASKS=4 "$info" --elastic | grep '^  newcomer: .*srun')
if [ -n "$alloc" ] && [ "$alloc" = "$step0" ]; then
  echo "PASS elastic-launch/info_slurm_allocation_names_the_steps_rendezvous"
else
  fail "elastic-launch/info_slurm_allocation_names_the_steps_rendezvous: '$alloc', a step has '$step0'"
fi

(umask 077 && echo "the job's secret" >"$work/secret")
expect torchrun_variables "MASTER_ADDR=m1 MASTER_PORT=29500 RANK=1 WORLD_SIZE=4" \
  "^elastic launch: env start-up" "^  launch:   MASTER_ADDR=m1 MASTER_PORT=29500 RANK=r WORLD_SIZE=N HORA_ELASTIC=1 \./train$" \
  "^  newcomer: HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=m1:29500 HORA_ELASTIC=1 \./train$" "!mpirun" "!srun"
expect rendezvous "HORA_RENDEZVOUS=h1:1234 HORA_SECRET_FILE=$work/secret" "^elastic launch: tcp start-up" \
  "$tcp_launch" \
  "^  newcomer: HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=h1:1234 HORA_ELASTIC=1 HORA_SECRET_FILE=$work/secret \./train$" \
  "^  secret:   HORA_SECRET_FILE: newcomers must give the same" "!mpirun" "!srun"
expect nothing_set "" "^elastic launch: single start-up" "${ompi_launch}HOST:PORT" "$hydra_launch" \
  "$srun_launch" "$env_launch" "$tcp_launch"
# The settings as they are, not as the choice above reads them.
expect settings "HORA_ELASTIC_MIN_SIZE=3 HORA_ELASTIC_TIMEOUT_SECONDS=5" "^  HORA_ELASTIC=0$" \
  "^  HORA_ELASTIC_MIN_SIZE=3$" "^  HORA_ELASTIC_MAX_SIZE=0$" "^  HORA_ELASTIC_TIMEOUT_SECONDS=5$"

# mpirun: rank 3 of 4 dies 0.5 s in, the others live 3 s.
if [ "${HAVE_MPI:-yes}" != yes ] || [ "$MPI_FLAVOR" != openmpi ]; then
  echo "SKIP elastic-launch/mpirun: needs Open MPI (this build: ${MPI_FLAVOR:-no MPI})"
  exit $failed
fi
opts=$(OMPI_COMM_WORLD_SIZE=4 "$info" --elastic | sed -n 's/^  launch:   mpirun \(.*\) -x HORA_ELASTIC=1 .*/\1/p')
[ -n "$opts" ] || fail "elastic-launch/mpirun: hora-info --elastic printed no mpirun line"
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
# (A run past 20 s timed out: timeout's own status would read like mpirun's.)
for mode in mpi env; do
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 5 20 "$MPIEXEC" $flags $opts -np 4 "$builddir/tests/launch/lose_one" $mode 3 500 3000 \
    </dev/null >"$work/kept" 2>&1
  rc=$? took=$(($(date +%s) - t0))
  alive=$(grep -c '^alive [012]$' "$work/kept")
  if [ $rc -eq 0 ] && [ "$alive" -eq 3 ] && [ $took -lt 20 ]; then
    echo "PASS elastic-launch/mpirun_${mode}_survivors_finish ($opts: 3 of 3, mpirun's exit status 0)"
  else
    fail "elastic-launch/mpirun_${mode}_survivors_finish: with $opts $alive of 3 finished, mpirun's exit status $rc after $took s"
    tail -n 20 "$work/kept"
  fi
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 5 20 "$MPIEXEC" $flags -np 4 "$builddir/tests/launch/lose_one" $mode 3 500 3000 \
    </dev/null >"$work/lost" 2>&1
  rc=$? took=$(($(date +%s) - t0))
  alive=$(grep -c '^alive' "$work/lost")
  if [ $rc -ne 0 ] && [ "$alive" -eq 0 ] && [ $took -lt 20 ]; then
    echo "PASS elastic-launch/mpirun_${mode}_without_the_options_kills_them (exit status $rc)"
  else
    fail "elastic-launch/mpirun_${mode}_without_the_options_kills_them: $alive finished, mpirun's exit status $rc after $took s"
    tail -n 20 "$work/lost"
  fi
done
exit $failed
