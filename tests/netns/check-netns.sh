#!/bin/sh
# Multi-host correctness on fake hosts made of network namespaces
# (../shared/netns): 4 hosts x 1 rank (rings over TCP) and 2 hosts x 2 ranks
# (hierarchical allreduce: shared memory within a host, TCP across), the
# hierarchical broadcast and allgather forced on 2 x 2, 2 x 3 and 3 x 2, also
# elastic training losing a whole host of 3 x 2,
# with the flat ring forced; process sets on 4 x 1 and 2 x 3; hierarchical
# Adasum on 2 x 2 and 2 x 3; the cost model's calibration on links shaped
# to 1 Gbit/s; a slow host named by the straggler report. Prints
# PASS/FAIL/SKIP lines.
# usage: check-netns.sh BUILDDIR
set -u
builddir=$(cd "$1" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
netns=
for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared" /work/shared; do
  if [ -n "$d" ] && [ -x "$d/netns/netns-cluster.sh" ]; then
    netns="$d/netns"
    break
  fi
done
progs="test_collectives test_engine test_join test_exchange test_adasum test_algorithms"
if [ "$(id -u)" -ne 0 ] || [ -z "$netns" ] || ! command -v ip >/dev/null 2>&1; then
  for p in $progs; do
    echo "SKIP netns/$p: needs root, iproute2 and ../shared/netns (set HORA_SHARED_DIR)"
  done
  exit 0
fi
# A name of our own, so a cluster someone else left up does not collide.
export NETNS_PREFIX="hn$$x"
work=$(mktemp -d)
cleanup() {
  "$netns/netns-cluster.sh" down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! "$netns/netns-cluster.sh" up 4 >"$work/up.log" 2>&1; then
  echo "FAIL netns/cluster_up"
  tail -n 5 "$work/up.log"
  exit 1
fi
printf '%s0 slots=1\n%s1 slots=1\n%s2 slots=1\n%s3 slots=1\n' "$NETNS_PREFIX" "$NETNS_PREFIX" \
  "$NETNS_PREFIX" "$NETNS_PREFIX" >"$work/hosts41"
printf '%s0 slots=2\n%s1 slots=2\n' "$NETNS_PREFIX" "$NETNS_PREFIX" >"$work/hosts22"
printf '%s0 slots=3\n%s1 slots=3\n' "$NETNS_PREFIX" "$NETNS_PREFIX" >"$work/hosts23"
printf '%s0 slots=2\n%s1 slots=2\n%s2 slots=2\n%s3 slots=2\n' "$NETNS_PREFIX" "$NETNS_PREFIX" \
  "$NETNS_PREFIX" "$NETNS_PREFIX" >"$work/hosts42"
printf '%s0 slots=2\n%s1 slots=2\n%s2 slots=2\n' "$NETNS_PREFIX" "$NETNS_PREFIX" \
  "$NETNS_PREFIX" >"$work/hosts32"

# Under a sanitizer, the runs whose code the one-host multi-rank section
# already checks under it (flat rings over TCP, forced algorithms, more
# sockets per peer) and those whose point is a time or a rate are left to
# the plain build: what stays is what only fake hosts reach (hierarchical
# algorithms, several transports in one job, bootstraps and elastic loss
# across hosts). That halves the section's minutes there.
. "$builddir/tests/config.sh"
sanitized=no
[ -n "$SANITIZERS" ] && [ "$SANITIZERS" != no ] && sanitized=yes
plain_only() { # label (true, with a SKIP line, in a sanitizer build)
  [ $sanitized = yes ] || return 1
  echo "SKIP netns-$1: sanitizer build (the plain build runs it)"
}
# In the full suite (scripts/test.sh sets HORA_TEST_SANITIZED_NPS) the
# plain build leaves the rest to the sanitized build, which runs them.
elsewhere=no
[ $sanitized = no ] && [ -n "${HORA_TEST_SANITIZED_NPS:-}" ] && elsewhere=yes
sanitized_runs() { # label (true, with a line, where the sanitized build runs it instead)
  [ $elsewhere = yes ] || return 1
  echo "   (netns-$1: left to the sanitized build)"
}

# Each run's milliseconds, for the slowest-runs lines at the end.
ms_now() { date +%s%3N; }
run() { # label hostfile program args...   (NP=n: other than 4 ranks; MAP=node: ranks round robin)
  label=$1 hosts=$2 prog=$3
  shift 3
  t0=$(ms_now)
  timeout -k 10 300 "$netns/mpirun-netns.sh" "$hosts" -np "${NP:-4}" ${MAP:+--map-by "$MAP"} \
    "$builddir/tests/mpi/$prog" "$@" </dev/null >"$work/out" 2>"$work/err"
  rc=$?
  echo "$(($(ms_now) - t0)) $label $prog" >>"$work/times"
  sed -n -E "s#^(PASS|FAIL|SKIP) #\\1 netns-$label/#p" "$work/out"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/out"; then
    echo "FAIL netns-$label/$prog: exit status $rc"
  fi
  if [ $rc -ne 0 ]; then
    tail -n 20 "$work/err"
  fi
}

for p in $progs; do
  plain_only "4x1/$p" || run 4x1 "$work/hosts41" "$p"
  sanitized_runs "2x2/$p" || run 2x2 "$work/hosts22" "$p"
done
plain_only 2x2-flat/test_collectives ||
  run 2x2-flat "$work/hosts22" test_collectives HORA_HIERARCHICAL_ALLREDUCE=0
plain_only 4x1-3-sockets/test_collectives ||
  run 4x1-3-sockets "$work/hosts41" test_collectives HORA_SOCKETS_PER_PEER=3
# The collective algorithms across hosts: forced over every rank (the tree
# with its links both within hosts and across), and the
# cost model's choice (the hierarchical allreduce with recursive doubling
# or Rabenseifner across hosts for small slices; 3 hosts fold).
plain_only 4x1-rd/test_algorithms ||
  run 4x1-rd "$work/hosts41" test_algorithms HORA_ALGORITHM_ALLREDUCE=rd HORA_ALGORITHM_BROADCAST=binomial HORA_ALGORITHM_ALLGATHER=bruck
plain_only 4x2/test_algorithms || NP=8 run 4x2 "$work/hosts42" test_algorithms
plain_only 4x2-rabenseifner/test_algorithms ||
  NP=8 run 4x2-rabenseifner "$work/hosts42" test_algorithms HORA_ALGORITHM_ALLREDUCE=rabenseifner HORA_ALGORITHM_REDUCESCATTER=ring HORA_HIERARCHICAL_ALLREDUCE=0
# The reduce-scatters over sockets also run where the allreduce is
# hierarchical (test_algorithms fails an algorithm forced in vain).
plain_only 4x2-tree/test_algorithms ||
  NP=8 run 4x2-tree "$work/hosts42" test_algorithms HORA_ALGORITHM_ALLREDUCE=tree HORA_ALGORITHM_REDUCESCATTER=halving
sanitized_runs 3x2-tree/test_algorithms || NP=6 run 3x2-tree "$work/hosts32" test_algorithms HORA_ALGORITHM_ALLREDUCE=tree HORA_CHUNK_SIZE=4K HORA_ALGORITHM_REDUCESCATTER=ring
sanitized_runs 3x2/test_algorithms || NP=6 run 3x2 "$work/hosts32" test_algorithms
# The hierarchical broadcast and allgather forced (test_algorithms fails
# where the selector fell back to another), with small chunks and
# shared-memory halves so that buffers span many of each; 3 hosts (not a
# power of two); the ranks of a host not contiguous in rank order (round
# robin); a joined rank; process sets hierarchical in themselves.
hier="HORA_ALGORITHM_BROADCAST=hierarchical HORA_ALGORITHM_ALLGATHER=hierarchical"
small="HORA_CHUNK_SIZE=16K HORA_SHM_BUFFER_SIZE=64K"
sanitized_runs 2x2-hierarchical-bcast-allgather/test_algorithms ||
  run 2x2-hierarchical-bcast-allgather "$work/hosts22" test_algorithms $hier $small
sanitized_runs 2x3-hierarchical-bcast-allgather/test_algorithms ||
  NP=6 run 2x3-hierarchical-bcast-allgather "$work/hosts23" test_algorithms $hier $small
sanitized_runs 3x2-hierarchical-bcast-allgather/test_algorithms ||
  NP=6 run 3x2-hierarchical-bcast-allgather "$work/hosts32" test_algorithms $hier $small
sanitized_runs 2x3-round-robin-hierarchical-bcast-allgather/test_algorithms ||
  NP=6 MAP=node run 2x3-round-robin-hierarchical-bcast-allgather "$work/hosts23" test_algorithms $hier $small
sanitized_runs 2x2-hierarchical-bcast-allgather/test_join ||
  run 2x2-hierarchical-bcast-allgather "$work/hosts22" test_join $hier
sanitized_runs 2x3-hierarchical-bcast-allgather/test_process_sets ||
  NP=6 run 2x3-hierarchical-bcast-allgather "$work/hosts23" test_process_sets $hier
# One negotiation cycle per small cached operation across hosts: ranks
# finish an operation at different times, and a partner asked before its
# own submission waits for it instead of ending the cycle empty (each such
# operation once took two cycles where waits spin: one rank per host).
if plain_only 4x1/one_cycle_per_small_operation; then
  :
elif [ -x "$builddir/hora-bench" ]; then
  timeout -k 10 300 "$netns/mpirun-netns.sh" "$work/hosts41" -np 4 -x HORA_SPIN_TIME_US=50 \
    "$builddir/hora-bench" -o allreduce -b 8 -e 8 -n 200 -r 3 --no-mpi --stages </dev/null >"$work/out" 2>&1
  cycles=$(sed -n 's/.*; \([0-9.]*\) cycles per operation.*/\1/p' "$work/out" | tail -n 1)
  if [ -n "$cycles" ] && awk -v c="$cycles" 'BEGIN {exit !(c < 1.25)}'; then
    echo "PASS netns-4x1/one_cycle_per_small_operation ($cycles cycles per 8-byte allreduce, waits spinning)"
  else
    echo "FAIL netns-4x1/one_cycle_per_small_operation ('$cycles' cycles per 8-byte allreduce; 1 expected)"
    tail -n 5 "$work/out"
  fi
else
  echo "SKIP netns-4x1/one_cycle_per_small_operation: no hora-bench in this build"
fi
# The cost model's calibration across hosts: on links shaped to 1 Gbit/s
# (8 ns a byte) it measures beta within 0.5x-2x of that (8.2-8.3 seen), and
# pairs rank 0 with the first rank on another host. On 2 x 2 that rank (2)
# is no ring neighbour of rank 0: its connection is made for the
# measurement, and every rank must still choose by rank 0's result.
if plain_only 4x1/calibrate_measures_a_1gbit_link; then
  :
elif "$netns/netns-cluster.sh" shape 1gbit >"$work/shape.log" 2>&1; then
  timeout -k 10 120 "$netns/mpirun-netns.sh" "$work/hosts41" -np 4 "$builddir/hora-info" --calibrate \
    </dev/null >"$work/out" 2>"$work/err"
  rc=$?
  nums=$(sed -n 's/^HORA_COST_MODEL=//p' "$work/out")
  if [ $rc -eq 0 ] && [ -n "$nums" ] &&
     echo "$nums" | awk -F, 'NF == 3 && $1 > 0 && $2 >= 4 && $2 <= 16 && $3 > 0 { ok = 1 } END { exit !ok }' &&
     grep -q "rank 0 (${NETNS_PREFIX}0) with rank 1 (${NETNS_PREFIX}1)" "$work/out"; then
    echo "PASS netns-4x1/calibrate_measures_a_1gbit_link (HORA_COST_MODEL=$nums: alpha us, beta ns/B, gamma ns/B)"
  else
    echo "FAIL netns-4x1/calibrate_measures_a_1gbit_link: exit status $rc; beta (ns/B) expected 4-16 on a 1 Gbit/s link"
    tail -n 10 "$work/out" "$work/err"
  fi
  timeout -k 10 120 "$netns/mpirun-netns.sh" "$work/hosts22" -np 4 "$builddir/hora-info" --calibrate \
    </dev/null >"$work/out" 2>"$work/err"
  rc=$?
  if [ $rc -eq 0 ] && grep -q "rank 0 (${NETNS_PREFIX}0) with rank 2 (${NETNS_PREFIX}1)" "$work/out"; then
    echo "PASS netns-2x2/calibrate_pairs_rank_0_with_another_host ($(grep '^HORA_COST_MODEL=' "$work/out"))"
  else
    echo "FAIL netns-2x2/calibrate_pairs_rank_0_with_another_host: exit status $rc"
    tail -n 10 "$work/out" "$work/err"
  fi
  "$netns/netns-cluster.sh" shape none >>"$work/shape.log" 2>&1
else
  echo "FAIL netns-4x1/calibrate_measures_a_1gbit_link: could not shape the links"
  tail -n 5 "$work/shape.log"
fi
sanitized_runs 2x2-calibrate/test_algorithms ||
  run 2x2-calibrate "$work/hosts22" test_algorithms HORA_COST_MODEL=calibrate
# A slow host: both ranks of the second of 2 x 2 fake hosts come 20 ms late
# to every step; rank 0's report names that host, not one of its ranks.
if plain_only 2x2/slow_host_is_named; then
  :
elif run 2x2-late-host "$work/hosts22" test_steps late-host HORA_STRAGGLER_REPORT_SECONDS=0.5 &&
     grep -qE "host ${NETNS_PREFIX}1 \(ranks 2-3\) was last in (8[0-9]|9[0-9]|100)% of the last" "$work/err"; then
  echo "PASS netns-2x2/slow_host_is_named ($(grep -m1 'was last in' "$work/err" | sed 's/.*hora WARN //'))"
else
  echo "FAIL netns-2x2/slow_host_is_named: no report names host ${NETNS_PREFIX}1 (ranks 2-3)"
  grep "was last in" "$work/err" | head -n 3
fi
# Process sets across hosts: one rank per host, and 2 hosts x 3 ranks, where
# the set of the first two ranks of each host is hierarchical in itself.
plain_only 4x1/test_process_sets || run 4x1 "$work/hosts41" test_process_sets
# (Sanitized: the hierarchical run of the same layout above reaches more.)
plain_only 2x3/test_process_sets || NP=6 run 2x3 "$work/hosts23" test_process_sets
# Hierarchical Adasum: each host's sum, then the tree over the hosts.
sanitized_runs 2x2-hierarchical/test_adasum ||
  run 2x2-hierarchical "$work/hosts22" test_adasum HORA_HIERARCHICAL_ADASUM=1
plain_only 2x3-hierarchical/test_adasum ||
  NP=6 run 2x3-hierarchical "$work/hosts23" test_adasum HORA_HIERARCHICAL_ADASUM=1

# The trainer across two hosts of two ranks reaches the accuracy of the same
# job on one host. Same seed, but the order of floating-point sums differs
# (hierarchical vs shared-memory allreduce), and one epoch of SGD amplifies
# that: a few tenths of a point apart is the same accuracy. Training under
# a sanitizer takes too long; the plain build runs it.
# Without MPI: each rank started in its fake host's namespace by hand, the
# job meeting at rank 0's rendezvous on 10.77.0.1 (hora's own variables,
# or torchrun's), 2 hosts x 2 ranks.
run_nompi() { # mode program
  mode=$1 prog=$2
  port=$((20000 + $$ % 10000))
  dir="$work/testdir-$mode"
  rm -rf "$dir"
  mkdir -p "$dir"
  pids=""
  for r in 0 1 2 3; do
    if [ "$mode" = tcp ]; then
      vars="HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=10.77.0.1:$port HORA_RANK=$r HORA_SIZE=4"
    else
      vars="MASTER_ADDR=10.77.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 GROUP_RANK=$((r / 2))"
    fi
    timeout -k 10 300 "$netns/netns-rsh.sh" "$NETNS_PREFIX$((r / 2))" \
      "env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK HORA_TEST_DIR=$dir HORA_SECRET=netns-$$ $vars $builddir/tests/mpi/$prog" \
      </dev/null >"$work/out$r" 2>"$work/err$r" &
    pids="$pids $!"
  done
  rc=0
  for p in $pids; do
    wait "$p" || rc=1
  done
  sed -n -E "s#^(PASS|FAIL|SKIP) #\\1 netns-2x2-$mode/#p" "$work/out0"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/out0"; then
    echo "FAIL netns-2x2-$mode/$prog: a rank exited with an error"
  fi
  if [ $rc -ne 0 ]; then
    tail -n 10 "$work/err0" "$work/err1" "$work/err2" "$work/err3"
  fi
}
sanitized_runs 2x2-tcp/test_collectives || run_nompi tcp test_collectives
sanitized_runs 2x2-env/test_collectives || run_nompi env test_collectives

# Elastic: 3 hosts x 2 ranks; host 2 disappears (its link taken down, its
# processes alive but cut off). Hosts 0 and 1 go on with 4 ranks; the two
# cut off have no majority and fail with a message saying so.
elastic_host_lost() {
  port=$((20000 + ($$ + 7) % 10000))
  pids=""
  for r in 0 1 2 3 4 5; do
    vars="HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=10.77.0.1:$port HORA_RANK=$r HORA_SIZE=6 HORA_ELASTIC=1"
    vars="$vars HORA_PEER_TIMEOUT_SECONDS=3 HORA_ELASTIC_TIMEOUT_SECONDS=10 HORA_TEST_STEP_MS=10"
    timeout -k 10 120 "$netns/netns-rsh.sh" "$NETNS_PREFIX$((r / 2))" \
      "env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK HORA_SECRET=netns-$$ $vars $builddir/tests/launch/elastic_probe 600 10" \
      </dev/null >"$work/eout$r" 2>"$work/eerr$r" &
    pids="$pids $!"
  done
  sleep 2
  ip -n "${NETNS_PREFIX}2" link set eth0 down
  for p in $pids; do
    wait "$p"
  done
  bad=""
  for r in 0 1 2 3; do
    grep -q "size 4 resets 1 step 600" "$work/eout$r" || bad="$bad $r"
  done
  for r in 4 5; do
    grep -q "more than half" "$work/eout$r" || bad="$bad $r(cut off: no quorum error)"
  done
  if [ -z "$bad" ]; then
    echo "PASS netns-3x2/elastic_host_lost: hosts 0 and 1 went on with 4 ranks; host 2's ranks failed: $(grep -ho 'only 2 of the 6[^:]*' "$work/eout4")"
  else
    echo "FAIL netns-3x2/elastic_host_lost:$bad"
    tail -n 6 "$work"/eout* "$work"/eerr*
  fi
}
sanitized_runs 3x2/elastic_host_lost || elastic_host_lost

if [ $sanitized = yes ]; then
  echo "SKIP netns-2x2/train_same_accuracy: sanitizer build (the plain build runs it)"
elif [ -x "$builddir/examples/train" ] && [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  timeout -k 10 600 "$netns/mpirun-netns.sh" "$work/hosts22" -np 4 "$builddir/examples/train" \
    --epochs 1 --checkpoint "$work/a.ckpt" </dev/null >"$work/train22" 2>&1
  flags=
  [ "$MPI_FLAVOR" = openmpi ] && flags="--oversubscribe --bind-to none --allow-run-as-root"
  timeout -k 10 600 "$MPIEXEC" $flags -np 4 "$builddir/examples/train" --epochs 1 \
    --checkpoint "$work/b.ckpt" </dev/null >"$work/train4" 2>&1
  a=$(sed -n 's/^test_accuracy=//p' "$work/train22")
  b=$(sed -n 's/^test_accuracy=//p' "$work/train4")
  if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN {d = a - b; exit !(d <= 0.02 && d >= -0.02 && a > 0.82 && b > 0.82)}'; then
    echo "PASS netns-2x2/train_same_accuracy (2 hosts x 2: $a, one host x 4: $b)"
  else
    echo "FAIL netns-2x2/train_same_accuracy (2 hosts x 2: '$a', one host x 4: '$b')"
    tail -n 10 "$work/train22"
  fi
else
  echo "SKIP netns-2x2/train_same_accuracy: examples/train or Fashion-MNIST missing"
fi
if [ -s "$work/times" ]; then
  echo "   (slowest netns runs, ms:"
  sort -rn "$work/times" | head -n 8 | sed 's/^/     /'
  echo "   ) (all $(wc -l <"$work/times") mpirun runs: $(awk '{ t += $1 } END { printf "%.0f", t / 1000 }' "$work/times") s)"
fi
