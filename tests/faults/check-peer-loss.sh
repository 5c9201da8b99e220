#!/bin/sh
# Peer loss: a rank dies (_exit, SIGKILL, SIGSEGV) in the middle of
# training, under mpirun told to leave the survivors running; each survivor
# must report HORA_ERR_PEER_LOST naming the dead rank within 10 s. Over
# shared memory and over sockets, with a worker and with rank 0 as victim.
# A stopped (SIGSTOP) rank instead makes the survivors time out through
# the stall shutdown, or, without one, be found lost by the heartbeats.
# usage: check-peer-loss.sh BUILDDIR [TRANSPORTS [MODES]]   (prints PASS/FAIL lines)
#        TRANSPORTS: HORA_TRANSPORT values to try (default "auto tcp"; the
#        RDMA check runs "ib" in the soft-RoCE VM); the stopped-rank case
#        runs with the default transports only. MODES: ways to die (default
#        "exit kill segv"), each for victims 1 and 0, or MODE:VICTIM for one.
set -u
builddir=$(cd "$1" && pwd)
. "$builddir/tests/config.sh"
prog="$builddir/tests/mpi/test_peer_loss"
if [ "$MPI_FLAVOR" != openmpi ]; then
  echo "SKIP faults/peer_loss: written for Open MPI's mpirun options"
  exit 0
fi
flags="--oversubscribe --bind-to none --mca orte_abort_on_non_zero_status 0"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
np=4

# The processes this script started under mpirun $1: its descendants (the
# ranks, and any daemon between), never processes of the same name that
# belong to someone else.
descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" '
    { parent[$1] = $2 }
    END {
      for (p in parent) {
        for (q = parent[p]; q != "" && q != 0 && q != 1; q = parent[q]) {
          if (q == root) { print p; break }
        }
      }
    }'
}

scenario() { # label expected-survivor-lines args...
  label=$1 want=$2
  shift 2
  "$MPIEXEC" $flags -np $np "$prog" "$@" </dev/null >"$work/out" 2>"$work/err" &
  mpid=$!
  # Wait for every survivor's report (each ends in _exit), then clear away
  # what is left: a stopped victim, an mpirun waiting for it.
  for i in $(seq 1 600); do
    [ "$(grep -c '^\(PASS\|FAIL\) peer_loss' "$work/out")" -ge "$want" ] && break
    kill -0 $mpid 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.5
  pids=$(descendants $mpid)
  if [ -n "$pids" ]; then
    kill -CONT $pids 2>/dev/null
    kill -KILL $pids 2>/dev/null
  fi
  # mpirun told to leave survivors running does not end when its ranks are
  # killed (it waited out the 10 s below in every scenario): stop it.
  kill -TERM $mpid 2>/dev/null
  for i in $(seq 1 100); do
    kill -0 $mpid 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL $mpid 2>/dev/null
  wait $mpid 2>/dev/null
  grep -E '^(PASS|FAIL) ' "$work/out"
  got=$(grep -c '^PASS peer_loss/[a-z0-9-]*/victim[0-9]*/rank[0-9]* ' "$work/out")
  if [ "$got" -ne "$want" ]; then
    echo "FAIL faults/$label: $got of $want survivors reported the loss in time"
    tail -n 15 "$work/err"
  fi
}

transports=${2:-auto tcp}
for transport in $transports; do
  for victim in 1 0; do
    for spec in ${3:-exit kill segv}; do
      mode=${spec%%:*}
      case "$spec" in *:*) [ "${spec#*:}" = "$victim" ] || continue ;; esac
      scenario "$transport/$mode/victim$victim" $((np - 1)) "$victim" "$mode" HORA_TRANSPORT=$transport
    done
  done
done
[ -n "${2:-}" ] && exit 0
# Over connections of several sockets each.
scenario "tcp-3-sockets/kill/victim1" $((np - 1)) 1 kill HORA_TRANSPORT=tcp HORA_SOCKETS_PER_PEER=3
# The logarithmic algorithms (partners beyond the ring's neighbours).
scenario "rd/kill/victim1" $((np - 1)) 1 kill HORA_ALGORITHM_ALLREDUCE=rd HORA_ALGORITHM_BROADCAST=binomial HORA_ALGORITHM_ALLGATHER=bruck
scenario "rabenseifner/exit/victim0" $((np - 1)) 0 exit HORA_ALGORITHM_ALLREDUCE=rabenseifner HORA_TRANSPORT=tcp
# Training in process sets of two: the sets without the victim fail too.
scenario "sets/kill/victim1" $((np - 1)) 1 sets-kill
scenario "sets/exit/victim0" $((np - 1)) 0 sets-exit HORA_TRANSPORT=tcp
# Alltoalls: pairwise over sockets, and through shared memory.
scenario "a2a/kill/victim1" $((np - 1)) 1 a2a-kill HORA_TRANSPORT=tcp
scenario "a2a/exit/victim0" $((np - 1)) 0 a2a-exit
# Alive but silent: the stall shutdown turns it into HORA_ERR_TIMEOUT.
scenario "stop/victim2" $((np - 1)) 2 stop HORA_STALL_CHECK_TIME_SECONDS=1 HORA_STALL_SHUTDOWN_TIME_SECONDS=3
# Alive but silent, no stall shutdown: the heartbeats find it lost.
scenario "silent/victim2" $((np - 1)) 2 silent HORA_PEER_TIMEOUT_SECONDS=4
scenario "silent/victim0" $((np - 1)) 0 silent HORA_PEER_TIMEOUT_SECONDS=4
# Device buffers (a CUDA build on a machine with a GPU): rank 1 dies while
# rank 0 waits for stream-ordered results (test_gpu peer_loss, np=2).
if [ -x "$builddir/tests/mpi/test_gpu" ] && ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  prog="$builddir/tests/mpi/test_gpu" np=2
  scenario "gpu/exit/victim1" 1 peer_loss
fi
exit 0
