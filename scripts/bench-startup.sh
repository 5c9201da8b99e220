#!/bin/bash
# Start-up time, from the process start to the first completed allreduce,
# three ways at each np, medians of --reps launches:
#   MPI   mpirun -np N hora-bench-startup (HORA_BOOTSTRAP=mpi; hora_init runs
#         MPI_Init, so that is counted)
#   tcp   N processes started here with HORA_BOOTSTRAP=tcp, HORA_RENDEZVOUS,
#         HORA_RANK, HORA_SIZE and HORA_SECRET_FILE (rank 0 listens)
#   gloo  N processes of examples/pytorch/bench_startup_gloo.py with torchrun's
#         variables set here (Debian's torchrun fails on Python 3.11 before
#         it starts workers); torch.distributed.init_process_group("gloo",
#         init_method="env://") and one all_reduce
# and the launcher's view of the same launches: from the fork to every rank's
# first allreduce, and from the fork to the exit of the last process (for
# MPI: mpirun's own start and its finalize included).
# Methods alternate within each repetition so all see the same machine;
# one untimed launch of each comes first, to warm the page cache.
# With --netns: 8 fake hosts (../shared/netns; needs root), ranks placed in
# blocks of N/8 per host as mpirun places them by slot, HORA_IFACE and
# GLOO_SOCKET_IFNAME eth0; np 8 and 16 (1 and 2 per host).
# usage: scripts/bench-startup.sh [--netns] [--reps 5] [--nps "2 4 8 16"]
#          [--only mpi,tcp,gloo] [--build DIR] [--raw FILE] [--timeout 300]
set -u
export LC_ALL=C
srcdir=$(cd "$(dirname "$0")/.." && pwd)
build=$srcdir reps=5 nps='' only=mpi,tcp,gloo raw='' tmo=300 use_netns=0
while [ $# -gt 0 ]; do
  case $1 in
    --netns) use_netns=1 ;;
    --reps) reps=$2; shift ;;
    --nps) nps=$2; shift ;;
    --only) only=$2; shift ;;
    --build) build=$(cd "$2" && pwd) || exit 2; shift ;;
    --raw) raw=$2; shift ;;
    --timeout) tmo=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
prog=$build/hora-bench-startup
gloo=$srcdir/examples/pytorch/bench_startup_gloo.py
python=${PYTHON:-/usr/bin/python3}
[ -x "$prog" ] || { echo "$0: $prog not built (make, or --build DIR)" >&2; exit 2; }
methods=
for m in mpi tcp gloo; do
  case ",$only," in *",$m,"*) methods="$methods $m" ;; esac
done
if [[ $methods == *gloo* ]] && ! "$python" -c 'import torch.distributed' 2>/dev/null; then
  echo "# gloo left out: $python cannot import torch.distributed" >&2
  methods=${methods/gloo/}
fi

# Nothing from the caller's environment may choose another path.
unset HORA_BOOTSTRAP HORA_RENDEZVOUS HORA_RANK HORA_SIZE HORA_SECRET HORA_SECRET_FILE \
  MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK
export OMPI_MCA_mpi_yield_when_idle=1 HWLOC_COMPONENTS=-pci,-linuxio
flags=(--oversubscribe --bind-to none)
if [ "$(id -u)" -eq 0 ]; then
  flags+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

work=$(mktemp -d)
netns=
cleanup() {
  [ -n "$netns" ] && "$netns/netns-cluster.sh" down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret")

nhosts=8
if [ $use_netns -eq 1 ]; then
  for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared" /work/shared; do
    [ -n "$d" ] && [ -x "$d/netns/netns-cluster.sh" ] && { netns="$d/netns"; break; }
  done
  if [ "$(id -u)" -ne 0 ] || [ -z "$netns" ] || ! command -v ip >/dev/null 2>&1; then
    echo "$0: --netns needs root, iproute2 and ../shared/netns (set HORA_SHARED_DIR)" >&2
    netns=
    exit 2
  fi
  nps=${nps:-8 16}
  for n in $nps; do
    if [ $((n % nhosts)) -ne 0 ] || [ "$n" -gt $((2 * nhosts)) ]; then
      echo "$0: --netns runs 1 or 2 ranks on each of $nhosts hosts: np 8 or 16, not $n" >&2
      exit 2
    fi
  done
  # A name of our own, so a cluster someone else left up does not collide.
  export NETNS_PREFIX="hs$$x"
  if ! "$netns/netns-cluster.sh" up $nhosts >"$work/up.log" 2>&1; then
    echo "$0: netns-cluster.sh up $nhosts failed:" >&2
    tail -n 5 "$work/up.log" >&2
    exit 1
  fi
  master=${NETNS_SUBNET:-10.77.0}.1
  for n in $nps; do
    for ((h = 0; h < nhosts; h++)); do echo "$NETNS_PREFIX$h slots=$((n / nhosts))"; done \
      >"$work/hosts$n"
  done
else
  nps=${nps:-2 4 8 16}
  master=127.0.0.1
fi

port_seq=0
free_port() {
  if [ -n "$netns" ]; then
    # Fresh namespaces: a new port each launch, so none waits out TIME_WAIT.
    port_seq=$((port_seq + 1))
    echo $((29500 + port_seq))
  else
    "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  fi
}

# One launch; sets t0, t1 (bash's realtime around it) and leaves the ranks'
# output in $work/out, their errors in $work/err.
launch() { # method np
  local m=$1 n=$2 r port per pids=()
  rm -f "$work"/out* "$work"/err*
  if [ "$m" = mpi ]; then
    local run=(mpirun) x=(-x HORA_BOOTSTRAP=mpi)
    if [ -n "$netns" ]; then
      run=("$netns/mpirun-netns.sh" "$work/hosts$n")
      x+=(-x HORA_IFACE=eth0)
    fi
    t0=$EPOCHREALTIME
    timeout -k 5 "$tmo" "${run[@]}" "${flags[@]}" -np "$n" "${x[@]}" "$prog" </dev/null \
      >"$work/out" 2>"$work/err"
    t1=$EPOCHREALTIME
    return
  fi
  port=$(free_port)
  per=$n
  [ -n "$netns" ] && per=$((n / nhosts))
  t0=$EPOCHREALTIME
  for ((r = 0; r < n; r++)); do
    local vars=()
    if [ "$m" = tcp ]; then
      vars=(HORA_BOOTSTRAP=tcp "HORA_RENDEZVOUS=$master:$port" "HORA_RANK=$r" "HORA_SIZE=$n"
        "HORA_SECRET_FILE=$work/secret")
      [ -n "$netns" ] && vars+=(HORA_IFACE=eth0)
      vars+=("$prog")
    else
      # As torchrun sets them (it also sets OMP_NUM_THREADS=1 for several
      # workers per host).
      vars=("MASTER_ADDR=$master" "MASTER_PORT=$port" "RANK=$r" "WORLD_SIZE=$n"
        "LOCAL_RANK=$((r % per))" "LOCAL_WORLD_SIZE=$per" "GROUP_RANK=$((r / per))"
        OMP_NUM_THREADS=1 "GLOO_SOCKET_IFNAME=$([ -n "$netns" ] && echo eth0 || echo lo)"
        "$python" "$gloo")
    fi
    if [ -n "$netns" ]; then
      # As netns-rsh.sh enters a fake host: its namespace and its own hostname.
      local h=$NETNS_PREFIX$((r / per))
      timeout -k 5 "$tmo" ip netns exec "$h" unshare --uts \
        sh -c 'hostname "$0"; exec env "$@"' "$h" "${vars[@]}" </dev/null \
        >"$work/out$r" 2>"$work/err$r" &
    else
      timeout -k 5 "$tmo" env "${vars[@]}" </dev/null >"$work/out$r" 2>"$work/err$r" &
    fi
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
  t1=$EPOCHREALTIME
  cat "$work"/out[0-9]* >"$work/out" 2>/dev/null
  cat "$work"/err[0-9]* >"$work/err" 2>/dev/null
}

# Runs one launch and appends "method np rep from_start after_last fork_ar
# fork_exit [import]" to $work/raw, or says on stderr why it does not count.
measure() { # method np rep
  local m=$1 n=$2 rep=$3 line
  launch "$m" "$n"
  line=$(grep -E "^startup np=$n " "$work/out")
  if [ "$(grep -c '^startup np=' "$work/out")" -ne 1 ] || [ -z "$line" ]; then
    local got
    got=$(sed -n 's/^startup np=\([0-9]*\).*/\1/p' "$work/out" | sort | uniq -c | awk '{ printf "%s%s x np=%s", (NR > 1 ? ", " : ""), $1, $2 }')
    echo "# $m np=$n rep $rep: no valid result (reported: ${got:-nothing}); last errors:" >&2
    [ "$m" = tcp ] && [ "$got" = "$n x np=1" ] &&
      echo "#   (each process ran alone: this build does not know HORA_BOOTSTRAP=tcp)" >&2
    tail -n 4 "$work/err" | sed 's/^/#   /' >&2
    return
  fi
  echo "$line" | awk -v m="$m" -v n="$n" -v rep="$rep" -v t0="$t0" -v t1="$t1" '{
      for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      last = (m == "gloo") ? v["import_end_realtime_max"] : v["start_realtime_max"]
      printf "%s %d %d %.6f %.6f %.6f %.6f", m, n, rep, v["first_allreduce_max"],
        v["done_realtime_max"] - last, v["done_realtime_max"] - t0, t1 - t0
      if (m == "gloo") printf " %.6f", v["import_max"]
      printf "\n" }' >>"$work/raw"
}

echo "# bench-startup: $([ -n "$netns" ] && echo "$nhosts fake hosts (netns)" || echo "one host, $(nproc) cores"), np: $nps, $reps launches each, methods:$methods" >&2
first_np=${nps%% *}
for m in $methods; do # warm-up, not counted
  launch "$m" "$first_np"
done
for n in $nps; do
  for ((rep = 1; rep <= reps; rep++)); do
    order=$methods
    [ $((rep % 2)) -eq 0 ] && order=$(printf '%s\n' $methods | tac | tr '\n' ' ')
    for m in $order; do measure "$m" "$n" "$rep"; done
  done
  echo "# np=$n done" >&2
done
touch "$work/raw"
[ -n "$raw" ] && cp "$work/raw" "$raw"

median() { # method np column
  awk -v m="$1" -v n="$2" -v c="$3" '$1 == m && $2 == n { print $c }' "$work/raw" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { if (x != "-" && y != "-" && y > 0) printf "%.2f", x / y; else print "-" }'; }
fmt() { awk -v x="$1" 'BEGIN { if (x == "-") print "-"; else printf "%.3f", x }'; }

table() { # column title
  local c=$1 n a b g
  echo "# $2"
  printf '%4s %9s %9s %9s %8s %8s' np MPI tcp gloo tcp/MPI tcp/gloo
  [ "$c" -eq 4 ] && printf ' %12s' "gloo import"
  printf '\n'
  for n in $nps; do
    a=$(median mpi "$n" "$c") b=$(median tcp "$n" "$c") g=$(median gloo "$n" "$c")
    printf '%4s %9s %9s %9s %8s %8s' "$n" "$(fmt "$a")" "$(fmt "$b")" "$(fmt "$g")" \
      "$(ratio "$b" "$a")" "$(ratio "$b" "$g")"
    [ "$c" -eq 4 ] && printf ' %12s' "$(fmt "$(median gloo "$n" 8)")"
    printf '\n'
  done
}
echo "# hora start-up, seconds, medians of $reps launches; $([ -n "$netns" ] && echo "$nhosts fake hosts (netns)" || echo "one host"); $(date '+%b %-d %H:%M'); commit $(git -C "$srcdir" rev-parse --short HEAD 2>/dev/null || echo '?')$([ "$build" != "$srcdir" ] && echo ", build $build")"
table 4 "process start -> first allreduce completed, max over ranks (gloo: from the end of 'import torch', which is shown apart)"
table 5 "last rank's start -> last rank's first allreduce (no launch skew; gloo: from the last rank's end of 'import torch')"
table 6 "launcher: fork -> first allreduce completed on every rank (gloo: import included)"
table 7 "launcher: fork -> every process exited (MPI: mpirun's start and finalize included)"
for m in $methods; do
  for n in $nps; do
    k=$(awk -v m="$m" -v n="$n" '$1 == m && $2 == n' "$work/raw" | wc -l)
    [ "$k" -lt "$reps" ] && echo "# $m np=$n: $k of $reps launches gave a result (reasons above)"
  done
done
last_np=${nps##* }
a=$(median mpi "$last_np" 4) b=$(median tcp "$last_np" 4) g=$(median gloo "$last_np" 4)
if [ "$a" != - ] && [ "$b" != - ] && [ "$g" != - ]; then
  awk -v a="$a" -v b="$b" -v g="$g" -v n="$last_np" 'BEGIN {
    printf "# goal at np=%s (first table): tcp <= MPI/2: %s (%.2f); tcp <= gloo: %s (%.2f)\n",
      n, b <= a / 2 ? "met" : "not met", b / a, b <= g ? "met" : "not met", b / g }'
fi
