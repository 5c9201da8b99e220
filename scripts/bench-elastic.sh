#!/bin/bash
# Elastic recovery times, medians of --reps runs at each np:
#   recovery  from a SIGKILL of one rank (the last; with --kill-first rank 0,
#             the coordinator) to the next completed allreduce on every
#             survivor: the loss noticed, the old membership ended, the new
#             one agreed and its communicator built, the state synced
#   join      from a new process's start to its first completed allreduce in
#             the job (it is admitted at the next commit; commits every step)
# Both from tests/launch/elastic_probe (an allreduce of 16 KiB per step,
# 10 ms of "compute" per step), started with hora's own rendezvous; times
# are CLOCK_MONOTONIC, one clock for every process of this machine. With
# --netns: 4 fake hosts (../shared/netns, links at 1 Gbit/s; needs root),
# ranks in blocks per host.
# usage: scripts/bench-elastic.sh [--netns] [--kill-first] [--reps 5]
#          [--nps "4 8 16"] [--build DIR]
set -u
export LC_ALL=C
srcdir=$(cd "$(dirname "$0")/.." && pwd)
build=$srcdir reps=5 nps="4 8 16" use_netns=0 victim=last
while [ $# -gt 0 ]; do
  case $1 in
    --netns) use_netns=1 ;;
    --kill-first) victim=first ;;
    --reps) reps=$2; shift ;;
    --nps) nps=$2; shift ;;
    --build) build=$(cd "$2" && pwd) || exit 2; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
probe=$build/tests/launch/elastic_probe
[ -x "$probe" ] || { echo "$0: $probe not built (make tests/launch/elastic_probe)" >&2; exit 2; }
for v in $(env | grep -E '^(OMPI_COMM_|PMIX?_|SLURM_|MASTER_|HORA_)[A-Za-z0-9_]*=' | cut -d= -f1); do
  unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
work=$(mktemp -d)
netns=
nhosts=4
cleanup() {
  [ -n "$netns" ] && "$netns/netns-cluster.sh" down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
host_addr=127.0.0.1
if [ $use_netns -eq 1 ]; then
  for d in "${HORA_SHARED_DIR:-}" "$srcdir/../shared" /work/shared; do
    [ -n "$d" ] && [ -x "$d/netns/netns-cluster.sh" ] && { netns="$d/netns"; break; }
  done
  if [ "$(id -u)" -ne 0 ] || [ -z "$netns" ]; then
    echo "$0: --netns needs root and ../shared/netns (set HORA_SHARED_DIR)" >&2
    exit 2
  fi
  export NETNS_PREFIX="hb$$x" # a name of our own: no collision with a cluster left up
  "$netns/netns-cluster.sh" up $nhosts 1gbit >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 2; }
  host_addr=10.77.0.1
fi
secret=$work/secret
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$secret")

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])'
}

# start TAG HOSTINDEX VAR=VALUE...: one probe, on fake host HOSTINDEX with --netns
start() {
  local tag=$1 h=$2
  shift 2
  if [ -n "$netns" ]; then
    (ip netns exec "${NETNS_PREFIX:-h}$h" unshare --uts sh -c "hostname h$h; exec env $* HORA_IFACE=eth0 timeout 120 '$probe' $steps 1" \
       >"$work/$tag" 2>"$work/$tag.err"; echo $? >"$work/$tag.rc") 2>/dev/null &
  else
    # (a status, not a signal: bash would announce the victim's death)
    (env "$@" timeout 120 "$probe" $steps 1 >"$work/$tag" 2>"$work/$tag.err"; echo $? >"$work/$tag.rc") 2>/dev/null &
  fi
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) printf "%.3f\n", a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }

steps=400
echo "# bench-elastic: $([ -n "$netns" ] && echo "$nhosts fake hosts (netns, 1 Gbit/s)" || echo "one host, $(nproc) cores"); killing the $victim rank; $reps runs per np" >&2
printf '%-5s %-22s %-22s\n' np "recovery s (median)" "join s (median)"
for n in $nps; do
  : >"$work/rec.$n"
  : >"$work/join.$n"
  per=$(( (n + nhosts - 1) / nhosts ))
  for rep in $(seq "$reps"); do
    rm -f "$work"/r.* "$work"/new*
    port=$(free_port)
    kill=$([ $victim = first ] && echo 0 || echo $((n - 1)))
    common="HORA_BOOTSTRAP=tcp HORA_RENDEZVOUS=$host_addr:$port HORA_ELASTIC=1 HORA_SECRET_FILE=$secret HORA_LOG_LEVEL=error HORA_TEST_TIMES=1 HORA_TEST_STEP_MS=10"
    for r in $(seq 0 $((n - 1))); do
      # shellcheck disable=SC2086
      start "r.$r" $((r / per)) $common HORA_SIZE=$n HORA_RANK=$r HORA_TEST_KILL=20:$kill
    done
    sleep 1.5
    # shellcheck disable=SC2086
    start new $(( (n - 1) / per )) $common
    wait 2>/dev/null
    killed=$(awk '/^killed-at/ {print $2}' "$work/r.$kill")
    last=$(cat "$work"/r.* "$work"/new | awk '/^recovered-at/ {print $2}' | sort -g | tail -n 1)
    if [ -n "$killed" ] && [ -n "$last" ]; then
      awk -v a="$killed" -v b="$last" 'BEGIN {printf "%.6f\n", b - a}' >>"$work/rec.$n"
    else
      echo "# np $n run $rep: no recovery measured" >&2
      tail -n 3 "$work"/r.*.err >&2
    fi
    awk '/^started-at/ {s=$2} /^first-at/ {printf "%.6f\n", $2 - s}' "$work/new" >>"$work/join.$n"
  done
  printf '%-5s %-22s %-22s\n' "$n" "$(median <"$work/rec.$n") ($(wc -l <"$work/rec.$n") runs)" \
    "$(median <"$work/join.$n") ($(wc -l <"$work/join.$n") runs)"
done
