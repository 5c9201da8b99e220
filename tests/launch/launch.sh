#!/bin/sh
# Starts a job without MPI: NP processes of PROGRAM on this host, told their
# places as hora's own bootstraps read them.
#   tcp: HORA_BOOTSTRAP=tcp, HORA_RENDEZVOUS=127.0.0.1:PORT, HORA_RANK, HORA_SIZE,
#        HORA_SECRET_FILE (a fresh file of mode 0600)
#   env: HORA_BOOTSTRAP=env and torchrun's variables (MASTER_ADDR, MASTER_PORT,
#        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ...),
#        HORA_SECRET
# Every process also gets HORA_TEST_DIR, a fresh directory the test harness
# (tests/mpi/mpitest.c) keeps its bookkeeping in; it is removed afterwards.
# Rank 0's output passes through unchanged (its PASS/FAIL lines); the other
# ranks' stderr goes to stderr, their stdout is shown when the job fails.
# When one process fails, or the job outlives HORA_TEST_TIMEOUT seconds
# (default 300), the others are stopped. Exit status: 0 when every process
# exited 0, else the first failure's status (124: timed out).
#
# usage: tests/launch/launch.sh tcp|env NP PROGRAM [ARGS...]
set -u
usage() {
  echo "usage: $0 tcp|env NP PROGRAM [ARGS...]" >&2
  exit 2
}
[ $# -ge 3 ] || usage
mode=$1 np=$2
shift 2
case "$mode" in tcp|env) ;; *) usage ;; esac
case "$np" in ''|*[!0-9]*) usage ;; esac
[ "$np" -ge 1 ] || usage
limit=${HORA_TEST_TIMEOUT:-300}

# No variable of another launcher may leak in: the harness and hora would
# take the job for an MPI or Slurm one (the Open MPI settings stay).
for v in $(env | grep -E '^(OMPI_|PMIX?_|SLURM_|HYDRA_|HYDI_|MPI_LOCAL)[A-Za-z0-9_]*=' | cut -d= -f1); do
  case "$v" in
    OMPI_MCA_orte_*|OMPI_MCA_ess*|OMPI_MCA_pmix*) ;;
    OMPI_MCA_*|OMPI_ALLOW_*) continue ;;
  esac
  unset "$v" 2>/dev/null
done
# Nor those of the other bootstraps: each mode is tested on its own.
unset HORA_BOOTSTRAP HORA_RENDEZVOUS HORA_RENDEZVOUS_PORT HORA_RANK HORA_SIZE HORA_SECRET \
  HORA_SECRET_FILE MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE \
  GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_WORLD_SIZE TORCHELASTIC_RUN_ID \
  TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS

work=$(mktemp -d "${TMPDIR:-/tmp}/hora-launch-XXXXXX") || exit 2
mkdir "$work/test"
stop_all() { # [SIGNAL]
  for f in "$work"/pid.*; do
    [ -f "$f" ] && kill -"${1:-TERM}" "$(cat "$f")" 2>/dev/null
  done
}
trap 'stop_all; rm -rf "$work"' EXIT
trap 'exit 143' TERM INT HUP

random() { od -An -N4 -tu4 /dev/urandom | tr -d ' '; }
secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
(umask 077 && printf '%s\n' "$secret" >"$work/secret")

# A port below the kernel's ephemeral range (so no outgoing connection takes
# it meanwhile) that nothing listens on.
port=
for _ in 1 2 3 4 5 6 7 8 9 10; do
  p=$((20000 + $(random) % 12000))
  if ! command -v ss >/dev/null 2>&1 || [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then
    port=$p
    break
  fi
done
[ -n "$port" ] || { echo "launch.sh: found no free port" >&2; exit 2; }

# One rank's variables, in the subshell that starts it.
rank_env() {
  export HORA_TEST_DIR="$work/test"
  if [ "$mode" = tcp ]; then
    export HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS="127.0.0.1:$port" HORA_RANK="$1" HORA_SIZE="$np" \
      HORA_SECRET_FILE="$work/secret"
  else
    export HORA_BOOTSTRAP=env MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK="$1" \
      WORLD_SIZE="$np" LOCAL_RANK="$1" LOCAL_WORLD_SIZE="$np" GROUP_RANK=0 GROUP_WORLD_SIZE=1 \
      ROLE_RANK="$1" ROLE_WORLD_SIZE="$np" TORCHELASTIC_RESTART_COUNT=0 \
      TORCHELASTIC_MAX_RESTARTS=0 HORA_SECRET="$secret"
  fi
}

r=0
while [ "$r" -lt "$np" ]; do
  # The wrapper records the status in a file: a plain sh cannot wait for
  # whichever child ends first. (Its own stderr, where the shell reports a
  # child stopped here as "Terminated", is dropped; the program's is kept.)
  (
    rank_env "$r"
    if [ "$r" -eq 0 ]; then
      "$@" </dev/null 2>&3 3>&- &
    else
      "$@" </dev/null >"$work/out.$r" 2>&3 3>&- &
    fi
    echo $! >"$work/pid.$r"
    wait $!
    echo $? >"$work/rc.$r.tmp" && mv "$work/rc.$r.tmp" "$work/rc.$r"
  ) 3>&2 2>/dev/null &
  r=$((r + 1))
done

# Polled with shell builtins (and the clock once a second): 16 ranks share
# two cores with this loop.
now() { date +%s; }
start=$(now) t=$start ticks=0
status=0 failed='' stopped='' seen=' ' done_n=0
while :; do
  r=0
  while [ "$r" -lt "$np" ]; do
    case "$seen" in
      *" $r "*) ;;
      *)
        if [ -f "$work/rc.$r" ]; then
          read -r rc <"$work/rc.$r"
          seen="$seen$r " done_n=$((done_n + 1))
          if [ "$rc" -ne 0 ] && [ -z "$failed" ]; then
            failed=$r status=$rc stopped=$t
            echo "launch.sh: rank $r of $np ($mode) exited with status $rc; stopping the others" >&2
            stop_all
          fi
        fi ;;
    esac
    r=$((r + 1))
  done
  [ "$done_n" -eq "$np" ] && break
  ticks=$((ticks + 1))
  if [ $((ticks % 10)) -eq 0 ]; then
    t=$(now)
  fi
  if [ -z "$failed" ] && [ $((t - start)) -ge "$limit" ]; then
    failed=timeout status=124 stopped=$t
    echo "launch.sh: the job of $np ($mode) ran past $limit s (HORA_TEST_TIMEOUT); stopping it" >&2
    stop_all
  fi
  if [ -n "$stopped" ] && [ $((t - stopped)) -ge 10 ]; then
    echo "launch.sh: processes still running 10 s after TERM; killing them" >&2
    stop_all KILL
    sleep 1
    break
  fi
  sleep 0.1
done
if [ -n "$failed" ]; then
  # The ranks that failed themselves (143: stopped here).
  r=1
  while [ "$r" -lt "$np" ]; do
    rc=$(cat "$work/rc.$r" 2>/dev/null)
    if [ -s "$work/out.$r" ] && [ "${rc:-0}" != 0 ] && [ "${rc:-0}" != 143 ]; then
      echo "---- stdout of rank $r (last 20 lines) ----" >&2
      tail -n 20 "$work/out.$r" >&2
    fi
    r=$((r + 1))
  done
fi
exit "$status"
