#!/bin/sh
# The Prometheus metrics (HORA_METRICS_*): a 4-rank job's endpoints parse
# (prometheus_client, promtool) and report what hora_get_stats reports; a
# real Prometheus server scraping them agrees; the %r files always parse
# (atomic writes) and hold the final counters after hora_finalize; bad
# input (a port in use, an unwritable file, malformed settings, garbage
# requests, a thousand connections during collectives) leaves the job
# running and the endpoint serving.
# usage: check-metrics.sh BUILDDIR   (prints PASS/FAIL lines)
set -u
builddir=$(cd "$1" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
. "$builddir/tests/config.sh"
py=${HORA_TEST_PYTHON:-/usr/bin/python3}
probe=$builddir/tests/metrics/metrics_probe
helper="$py $srcdir/tests/metrics/metrics_check.py"
work=$(mktemp -d)
prom_pid= job_pid=
cleanup() {
  [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
  [ -n "$job_pid" ] && kill "$job_pid" 2>/dev/null && wait "$job_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
flags=
[ "$MPI_FLAVOR" = openmpi ] && flags="--oversubscribe --bind-to none"
[ "$MPI_FLAVOR" = openmpi ] && [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
export OMPI_MCA_mpi_yield_when_idle=1

# install-deps.sh installs these: missing is a failure, not a skip.
missing=
for t in prometheus promtool; do command -v $t >/dev/null 2>&1 || missing="$missing $t"; done
"$py" -c 'import prometheus_client' 2>/dev/null || missing="$missing python3-prometheus-client"
if [ -n "$missing" ]; then
  echo "FAIL metrics/tools: missing$missing (scripts/install-deps.sh installs them)"
  exit 0
fi
if [ "${HAVE_MPI:-yes}" = no ]; then
  echo "SKIP metrics/multi_rank: libhora built without MPI (the MPI build runs them)"
fi

# Waits (sleeping) until FILE has N lines matching RE, or S seconds pass.
count_lines() { cat "$2" 2>/dev/null | grep -c "$1"; }
wait_lines() { # file re n seconds
  i=0
  while [ "$(count_lines "$2" "$1")" -lt "$3" ] && [ $i -lt $(($4 * 10)) ]; do
    sleep 0.1
    i=$((i + 1))
  done
  [ "$(count_lines "$2" "$1")" -ge "$3" ]
}

# ---- a 4-rank job, its endpoints, its files, a Prometheus server ----------
if [ "${HAVE_MPI:-yes}" != no ]; then
  base=$($helper freeport 4)
  mkdir -p "$work/files"
  HORA_METRICS_PORT=$base HORA_METRICS_FILE="$work/files/hora.%r.prom" \
    HORA_METRICS_INTERVAL_SECONDS=0.1 timeout -k 10 300 \
    "$MPIEXEC" $flags -np 4 -x HORA_METRICS_PORT -x HORA_METRICS_FILE -x HORA_METRICS_INTERVAL_SECONDS \
    "$probe" -n 30 -w "$work/go" -t 200 </dev/null >"$work/job.out" 2>"$work/job.err" &
  job_pid=$!
  if wait_lines "$work/job.out" '^STATS' 4 120; then
    $helper scrape "$base" 4 "$work/job.out"
    bad=
    for r in 0 1 2 3; do
      promtool check metrics <"$work/job.out.rank$r.prom" >"$work/promtool.$r" 2>&1 || bad="$bad $r"
    done
    if [ -z "$bad" ]; then
      echo "PASS metrics/promtool_check_metrics (np=4)"
    else
      echo "FAIL metrics/promtool_check_metrics: ranks$bad: $(head -n 3 "$work/promtool.${bad##* }")"
    fi
    $helper files "$work/files/hora.%r.prom" 4 "$work/job.out" 100
    # A real server, its own port and storage, scraping every second.
    pport=$($helper freeport 1)
    {
      echo "global: {scrape_interval: 1s, scrape_timeout: 1s}"
      echo "scrape_configs:"
      echo "  - job_name: hora"
      echo "    static_configs:"
      echo "      - targets: ['127.0.0.1:$base', '127.0.0.1:$((base + 1))', '127.0.0.1:$((base + 2))', '127.0.0.1:$((base + 3))']"
    } >"$work/prometheus.yml"
    prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
      --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$work/prom.log" 2>&1 &
    prom_pid=$!
    $helper prometheus "http://127.0.0.1:$pport" 4 "$work/job.out" 90
    kill "$prom_pid" 2>/dev/null
    wait "$prom_pid" 2>/dev/null
    prom_pid=
  else
    echo "FAIL metrics/exposition_parses_with_prometheus_client: the job printed no STATS lines"
    tail -n 20 "$work/job.err"
  fi
  touch "$work/go"
  wait "$job_pid"
  rc=$?
  job_pid=
  if [ $rc -eq 0 ]; then
    $helper files-final "$work/files/hora.%r.prom" 4 "$work/job.out"
  else
    echo "FAIL metrics/file_written_at_finalize: the job's exit status was $rc"
    tail -n 20 "$work/job.err"
  fi
fi

# ---- bad input --------------------------------------------------------------
# A port in use: a warning naming address and port, and the job completes.
if [ "${HAVE_MPI:-yes}" != no ]; then
  base=$($helper freeport 2)
  "$py" -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
open(sys.argv[2], "w").close(); time.sleep(120)' "$base" "$work/held" &
  holder=$!
  while [ ! -e "$work/held" ]; do sleep 0.1; done
  HORA_METRICS_PORT=$base timeout -k 10 120 "$MPIEXEC" $flags -np 2 -x HORA_METRICS_PORT "$probe" -n 3 \
    </dev/null >"$work/inuse.out" 2>&1
  rc=$?
  kill "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  n=$(grep -c "cannot serve metrics on 127.0.0.1:$base (Address already in use)" "$work/inuse.out")
  if [ $rc -eq 0 ] && [ "$n" -eq 1 ] && [ "$(grep -c '^STATS' "$work/inuse.out")" -eq 2 ]; then
    echo "PASS metrics/port_in_use_warns_and_runs_on"
  else
    echo "FAIL metrics/port_in_use_warns_and_runs_on: exit status $rc, $n warnings"
    tail -n 10 "$work/inuse.out"
  fi

  # A file that cannot be written: one warning per rank, not one per interval.
  HORA_METRICS_FILE=/nonexistent-hora-dir/m.%r.prom HORA_METRICS_INTERVAL_SECONDS=0.05 \
    timeout -k 10 120 "$MPIEXEC" $flags -np 2 -x HORA_METRICS_FILE -x HORA_METRICS_INTERVAL_SECONDS \
    "$probe" -n 3 -l 1 </dev/null >"$work/nofile.out" 2>&1
  rc=$?
  n=$(grep -c "HORA_METRICS_FILE: cannot write /nonexistent-hora-dir/m.[01].prom" "$work/nofile.out")
  if [ $rc -eq 0 ] && [ "$n" -eq 2 ]; then
    echo "PASS metrics/unwritable_file_warns_once_and_runs_on"
  else
    echo "FAIL metrics/unwritable_file_warns_once_and_runs_on: exit status $rc, $n warnings (want 2)"
    tail -n 10 "$work/nofile.out"
  fi

  # A thousand connections while collectives run: they complete promptly,
  # the descriptors stay bounded, the endpoint serves afterwards.
  base=$($helper freeport 2)
  HORA_METRICS_PORT=$base timeout -k 10 180 "$MPIEXEC" $flags -np 2 -x HORA_METRICS_PORT \
    "$probe" -n 3 -l 12 -w "$work/flood-go" -t 120 </dev/null >"$work/flood.out" 2>"$work/flood.err" &
  job_pid=$!
  if wait_lines "$work/flood.out" '^PID' 2 60; then
    pid=$(awk '$1 == "PID" && $2 == 0 { print $3 }' "$work/flood.out")
    sleep 1
    $helper flood "$base" 1000 6 "$pid"
  fi
  wait_lines "$work/flood.out" '^STATS' 2 120
  touch "$work/flood-go"
  wait "$job_pid"
  rc=$?
  job_pid=
  worst=$(awk '$1 == "LATENCY" { if ($3 > w) w = $3 } END { print w + 0 }' "$work/flood.out")
  # Loaded 2-core machines see pauses of some 100 ms without any flood.
  if [ $rc -eq 0 ] && [ "$(grep -c '^LATENCY' "$work/flood.out")" -eq 2 ] &&
     awk -v w="$worst" 'BEGIN { exit !(w < 3000) }'; then
    echo "PASS metrics/collectives_run_on_during_flood (slowest allreduce ${worst} ms)"
  else
    echo "FAIL metrics/collectives_run_on_during_flood: exit status $rc, slowest ${worst} ms"
    tail -n 10 "$work/flood.err"
  fi
fi

# One process (no launcher): malformed settings fail hora_init, naming
# them; garbage requests get 400 and the endpoint serves on.
for setting in HORA_METRICS_PORT=http HORA_METRICS_PORT=70000 HORA_METRICS_ADDR=localhost \
               HORA_METRICS_INTERVAL_SECONDS=0; do
  env -u OMPI_COMM_WORLD_SIZE -u PMI_RANK "$setting" timeout 60 "$probe" -n 1 >"$work/bad.out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "${setting%%=*}" "$work/bad.out"; then
    echo "PASS metrics/malformed_setting_fails_init ($setting)"
  else
    echo "FAIL metrics/malformed_setting_fails_init: $setting: exit status $rc: $(head -c 300 "$work/bad.out")"
  fi
done
base=$($helper freeport 1)
HORA_METRICS_PORT=$base timeout -k 10 120 "$probe" -n 2 -w "$work/bad-go" -t 100 \
  >"$work/single.out" 2>&1 &
job_pid=$!
if wait_lines "$work/single.out" '^STATS' 1 60; then
  $helper bad "$base"
fi
touch "$work/bad-go"
wait "$job_pid"
rc=$?
job_pid=
[ $rc -eq 0 ] || echo "FAIL metrics/single_process_job: exit status $rc: $(tail -n 5 "$work/single.out")"

# A sanitizer build's reports land in the jobs' output.
if grep -lE 'runtime error:|ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer' "$work"/*.out "$work"/*.err \
     >"$work/reports" 2>/dev/null; then
  echo "FAIL metrics/sanitizer_report: in $(tr '\n' ' ' <"$work/reports")"
  grep -h -A12 -E 'runtime error:|ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer' "$work"/*.out "$work"/*.err | head -n 40
fi
