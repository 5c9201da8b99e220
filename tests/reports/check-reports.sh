#!/bin/sh
# hora-report and hora-bench --csv: the parser's unit tests on synthetic
# timelines; hora-report on a timeline recorded at np 4 (test_timeline's
# "report" workload, fused with HORA_EAGER_THRESHOLD=0) making three valid
# PNGs, its figures equal to rank 0's hora_get_stats; and hora-bench --csv
# parsed and drawn by scripts/plot-bench.py. Prints PASS/FAIL/SKIP lines.
# usage: check-reports.sh BUILDDIR
set -u
builddir=$(cd "$1" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
. "$builddir/tests/config.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3
flags=
[ "$MPI_FLAVOR" = openmpi ] && flags="--oversubscribe --bind-to none"
[ "$MPI_FLAVOR" = openmpi ] && [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"

if [ ! -x "$py" ] || ! "$py" -c 'import matplotlib' >/dev/null 2>&1; then
  echo "SKIP reports/all: $py cannot import matplotlib (scripts/install-deps.sh installs python3-matplotlib)"
  exit 0
fi
if [ ! -x "$builddir/hora-report" ]; then
  echo "FAIL reports/built: no $builddir/hora-report (configure found no Python?)"
  exit 0
fi

PYTHONPATH="$srcdir/python" "$py" "$srcdir/tests/reports/test_report_parse.py" \
  "$builddir/hora-report" 2>&1

# A PNG's signature and IHDR size, and more than 5 KB: "W H" or nothing.
png_ok() {
  "$py" - "$1" <<'PY'
import os, sys
p = sys.argv[1]
try:
    head = open(p, "rb").read(24)
except OSError:
    sys.exit(1)
if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR" or os.path.getsize(p) <= 5000:
    sys.exit(1)
w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
sys.exit(0 if w >= 200 and h >= 200 else 1)
PY
}

if [ -z "${MPIEXEC:-}" ] || [ ! -x "$builddir/tests/mpi/test_timeline" ]; then
  echo "SKIP reports/real_run: no MPI launcher, or tests/mpi/test_timeline not built (make it: the suite builds it)"
  exit 0
fi

# A real run: 12 steps at np 4; rank 0 prints its counters.
HORA_EAGER_THRESHOLD=0 timeout -k 10 120 "$MPIEXEC" $flags -np 4 \
  "$builddir/tests/mpi/test_timeline" "$work/run.json" report </dev/null >"$work/out" 2>&1
rc=$?
if [ $rc -ne 0 ] || ! grep -q '^STATS ' "$work/out"; then
  echo "FAIL np=4 reports/real_run: test_timeline report exited $rc"
  tail -n 20 "$work/out"
else
  "$builddir/hora-report" "$work/run.json" -o "$work/plots" --json "$work/summary.json" \
    >"$work/report" 2>&1
  rc=$?
  bad=
  for p in steps lateness busbw; do
    png_ok "$work/plots/run-$p.png" || bad="$bad run-$p.png"
  done
  if [ $rc -eq 0 ] && [ -z "$bad" ]; then
    echo "PASS np=4 reports/real_run_plots_are_pngs"
  else
    echo "FAIL np=4 reports/real_run_plots_are_pngs: exit status $rc; not a PNG of over 5 KB:$bad"
    tail -n 20 "$work/report"
  fi
  # hora-report's counts against rank 0's hora_get_stats.
  "$py" - "$work/summary.json" "$(grep '^STATS ' "$work/out" | head -n 1)" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
st = dict(kv.split("=") for kv in sys.argv[2].split()[1:])
st = {k: int(v) for k, v in st.items()}
kinds = s["operations_by_kind"]
got = {"operations": s["operations"], "allreduces": kinds.get("allreduce", 0),
       "broadcasts": kinds.get("broadcast", 0), "allgathers": kinds.get("allgather", 0),
       "bytes": s["bytes"], "fused_batches": s["fused_batches"],
       "fused_tensors": s["fused_tensors"]}
bad = ["%s %d, stats %d" % (k, got[k], st[k]) for k in st if got.get(k) != st[k]]
if bad:
    print("FAIL np=4 reports/real_run_agrees_with_hora_get_stats: " + "; ".join(bad))
else:
    print("PASS np=4 reports/real_run_agrees_with_hora_get_stats (%d operations, %d fused batches)"
          % (got["operations"], got["fused_batches"]))
# No STEP marks in this run: steps come from its 12 bursts, and it says so.
if s["steps_source"] != "bursts" or not 11 <= len(s["steps"]) <= 13:
    print("FAIL np=4 reports/real_run_steps_from_bursts: %s, %d steps (12 expected)"
          % (s["steps_source"], len(s["steps"])))
else:
    print("PASS np=4 reports/real_run_steps_from_bursts")
# Full negotiations (the first step) carry lateness from all 4 ranks.
lm = s["lateness_marks"]
if lm["operations"] < 1 or sorted(lm["ranks"]) != ["0", "1", "2", "3"]:
    print("FAIL np=4 reports/real_run_lateness_from_marks: %r" % lm)
else:
    print("PASS np=4 reports/real_run_lateness_from_marks")
PY
  if ! grep -q "the timeline has no STEP marks" "$work/report"; then
    echo "FAIL np=4 reports/real_run_says_no_step_marks"
    cat "$work/report"
  else
    echo "PASS np=4 reports/real_run_says_no_step_marks"
  fi
fi

# hora-bench --csv, to a file and to stdout, and its plot.
if [ ! -x "$builddir/hora-bench" ]; then
  echo "SKIP reports/bench_csv: hora-bench was not built"
  exit 0
fi
timeout -k 10 120 "$MPIEXEC" $flags -np 2 "$builddir/hora-bench" -b 1K -e 64K -f 8 \
  -o allreduce -r 2 -n 20 --csv "$work/bench.csv" </dev/null >"$work/bench.out" 2>&1
rc=$?
timeout -k 10 120 "$MPIEXEC" $flags -np 2 "$builddir/hora-bench" -b 1K -e 8K -f 8 \
  -o broadcast -r 2 -n 20 --csv - </dev/null >"$work/stdout.csv" 2>"$work/bench.err"
rc2=$?
"$py" - "$work/bench.csv" "$work/stdout.csv" "$rc" "$rc2" <<'PY'
import csv, sys
want = ["op", "bytes", "count", "ranks", "impl", "time_us", "algbw_gbps", "busbw_gbps", "errors"]
bad = []
for path, rc, op, sizes in ((sys.argv[1], sys.argv[3], "allreduce", {1024, 8192, 65536}),
                            (sys.argv[2], sys.argv[4], "broadcast", {1024, 8192})):
    if rc != "0":
        bad.append("%s: hora-bench exited %s" % (op, rc))
        continue
    try:
        rows = list(csv.DictReader(open(path)))
        header = open(path).readline().strip().split(",")
    except OSError as e:
        bad.append(str(e))
        continue
    if header != want:
        bad.append("%s: header %s" % (op, header))
        continue
    seen = {(r["op"], int(r["bytes"]), r["impl"]) for r in rows}
    expect = {(op, b, impl) for b in sizes for impl in ("hora", "MPI")}
    if seen != expect:
        bad.append("%s: rows %s, expected %s" % (op, sorted(seen), sorted(expect)))
    for r in rows:
        if int(r["ranks"]) != 2 or float(r["time_us"]) <= 0 or float(r["busbw_gbps"]) <= 0 \
                or int(r["errors"]) != 0:
            bad.append("%s: row %s" % (op, r))
if bad:
    print("FAIL np=2 reports/bench_csv: " + "; ".join(bad[:4]))
else:
    print("PASS np=2 reports/bench_csv (to a file, and to stdout)")
PY
if "$py" "$srcdir/scripts/plot-bench.py" -o "$work/bench.png" "$work/bench.csv" \
     "stdout=$work/stdout.csv" >"$work/plot.out" 2>&1 && png_ok "$work/bench.png"; then
  echo "PASS reports/plot_bench_png"
else
  echo "FAIL reports/plot_bench_png: no PNG of over 5 KB"
  cat "$work/plot.out"
fi
