#!/bin/sh
# What the metrics cost: hora-bench-resnet's ResNet-50 gradient set step
# (the "hora (161 async, fused)" median of each run) with the metrics off
# and on, runs alternating so both see the same machine. On: every rank
# serves HORA_METRICS_PORT and a scraper fetches every rank's /metrics once
# a second, and writes HORA_METRICS_FILE each second. Prints the median
# over the runs of each and on/off per rank count.
# usage: scripts/bench-metrics-overhead.sh [BUILDDIR] [RUNS] [NP...]
#        (defaults: ., 5, 2 16; METRICS_SCRAPER=0: the endpoint and file on, nobody scraping)
set -u
builddir=$(cd "${1:-.}" && pwd)
runs=${2:-5}
shift 2 2>/dev/null || shift $#
nps=${*:-2 16}
bench=$builddir/hora-bench-resnet
[ -x "$bench" ] || { echo "no $bench: build first" >&2; exit 2; }
export OMPI_MCA_mpi_yield_when_idle=1 HWLOC_COMPONENTS=-pci,-linuxio
# One intra-host path for every run: auto's choice, timed on the first
# steps, flips with the machine's noise and halves or doubles the step.
export HORA_SHM_SINGLE_COPY=${HORA_SHM_SINGLE_COPY:-1}
flags="--oversubscribe --bind-to none"
if [ "$(id -u)" -eq 0 ]; then
  flags="$flags --allow-run-as-root"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
work=$(mktemp -d)
scraper=
trap '[ -n "$scraper" ] && kill $scraper 2>/dev/null; rm -rf "$work"' EXIT
py=/usr/bin/python3

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

one() { # np on|off -> the run's median step in ms
  np=$1 mode=$2
  if [ "$mode" = on ]; then
    port=$($py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    [ $((port + np)) -gt 65535 ] && port=40000
    # Polls every rank's endpoint once a second, as Prometheus would (from
    # another machine: here it shares the ranks' cores; METRICS_SCRAPER=0
    # leaves it out, to tell its own CPU from the endpoint's).
    [ "${METRICS_SCRAPER:-1}" = 0 ] || $py -c 'import sys, time, urllib.request
base, n = int(sys.argv[1]), int(sys.argv[2])
while True:
    for r in range(n):
        try: urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (base + r), timeout=2).read()
        except Exception: pass
    time.sleep(1)' "$port" "$np" &
    scraper=$!
    HORA_METRICS_PORT=$port HORA_METRICS_FILE="$work/m.%r.prom" HORA_METRICS_INTERVAL_SECONDS=1 \
      mpirun $flags -np "$np" -x HORA_METRICS_PORT -x HORA_METRICS_FILE -x HORA_METRICS_INTERVAL_SECONDS \
      "$bench" --reps 7 --warmup 3 --lat-iters 100 >"$work/out" 2>&1
    kill $scraper 2>/dev/null
    wait $scraper 2>/dev/null
    scraper=
  else
    mpirun $flags -np "$np" "$bench" --reps 7 --warmup 3 --lat-iters 100 >"$work/out" 2>&1
  fi
  awk '/hora \(161 async, fused\)/ { for (i = 1; i <= NF; i++) if ($i == "ms") { print $(i - 1); exit } }' "$work/out"
}

for np in $nps; do
  : >"$work/off" && : >"$work/on" && : >"$work/ratio"
  for i in $(seq "$runs"); do
    off=$(one "$np" off) && on=$(one "$np" on)
    echo "np=$np run $i: off $off ms, on $on ms"
    [ -n "$off" ] && echo "$off" >>"$work/off"
    [ -n "$on" ] && echo "$on" >>"$work/on"
    [ -n "$off" ] && [ -n "$on" ] && awk -v a="$on" -v b="$off" 'BEGIN { print a / b }' >>"$work/ratio"
  done
  moff=$(median <"$work/off") mon=$(median <"$work/on")
  # The pairs' ratios too: a run next to its partner shares its machine.
  echo "np=$np: median step off $moff ms, on $mon ms, on/off = $(awk -v a="$mon" -v b="$moff" 'BEGIN { printf "%.3f", a / b }'); median of the pairs' on/off $(median <"$work/ratio" | awk '{ printf "%.3f", $1 }') ($runs runs each)"
done
