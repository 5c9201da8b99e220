#!/bin/sh
# Runs tests/mpi/test_timeline and checks the trace it writes: valid JSON,
# every phase of a fused tensor in order (negotiation with one mark per
# rank, queue, copy in, allreduce, copy out), balanced begin/end events,
# cycle marks (HORA_TIMELINE_MARK_CYCLES);
# valid JSON even after rank 0 was killed mid-job, and after a write failed
# (rank 0 limited to 64 bytes of file: the timeline stops with a warning);
# and started and stopped at run time (hora_start_timeline, with cycle
# marks, then into a second file and a third that replaces it): every file
# valid and balanced, holding the operations of its own stretch only.
# Horovod's names: HOROVOD_TIMELINE and HOROVOD_TIMELINE_MARK_CYCLES write
# the same file; HOROVOD_FUSION_THRESHOLD=0 leaves no fusion-buffer copies
# in it; HOROVOD_TIMELINE=DYNAMIC writes nothing until hora_start_timeline.
# usage: check-timeline.sh BUILDDIR NP   (prints PASS/FAIL lines)
set -u
builddir=$(cd "$1" && pwd) np=$2
. "$builddir/tests/config.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=
[ "$MPI_FLAVOR" = openmpi ] && flags="--oversubscribe --bind-to none"
[ "$MPI_FLAVOR" = openmpi ] && [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"

check() { # file mode
  python3 - "$1" "$2" "$np" <<'PY'
import json, sys
path, mode, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    events = json.load(open(path))
except Exception as e:
    print("FAIL timeline/%s_valid_json: %s" % (mode, e)); sys.exit(1)
if not isinstance(events, list) or (not events and mode != "full"):
    print("FAIL timeline/%s_valid_json: not a non-empty array" % mode); sys.exit(1)
print("PASS timeline/%s_valid_json (%d events)" % (mode, len(events)))
rows = {e["args"]["name"]: e["tid"] for e in events if e.get("ph") == "M"}
bad = []
def phases(tid):
    return [(e["ph"], e.get("name")) for e in events if e.get("tid") == tid and e.get("ph") != "M"]
for tid in rows.values():
    depth = 0
    for ph, _ in phases(tid):
        depth += {"B": 1, "E": -1}.get(ph, 0)
        if depth < 0:
            bad.append("unbalanced end on row %d" % tid)
    if mode in ("finalize", "horovod", "nofusion") and depth != 0:
        bad.append("row %d ends with %d open phases" % (tid, depth))
if mode in ("finalize", "horovod"):
    seq = phases(rows.get("tl/grad.3", -1))
    # One step of a fused tensor: the order its phases must come in.
    want = ["NEGOTIATE_ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE",
            "MEMCPY_OUT_FUSION_BUFFER"]
    begins = [n for ph, n in seq if ph == "B"]
    marks = [n for ph, n in seq if ph == "i"]
    if np > 1 and begins[:5] != want:
        bad.append("tl/grad.3 phases %s, expected %s" % (begins[:5], want))
    for r in range(np):
        if ("rank %d ready" % r) not in marks:
            bad.append("tl/grad.3 lacks the mark 'rank %d ready'" % r)
    # A lone tensor is not fused; over shared memory it is still staged.
    lone = [n for ph, n in phases(rows.get("tl/lone", -1)) if ph == "B"]
    if lone[:2] != ["NEGOTIATE_ALLREDUCE", "QUEUE"] or "ALLREDUCE" not in lone:
        bad.append("tl/lone phases %s" % lone[:4])
    for name, kind in (("tl/bcast", "BROADCAST"), ("tl/gather", "ALLGATHER")):
        if kind not in [n for ph, n in phases(rows.get(name, -1)) if ph == "B"]:
            bad.append("%s has no %s phase" % (name, kind))
    ts = [e["ts"] for e in events if "ts" in e]
    if any(b < a for a, b in zip(ts, ts[1:])):
        bad.append("timestamps go backwards")
    # Written with HORA_TIMELINE_MARK_CYCLES=1 (HOROVOD_TIMELINE_MARK_CYCLES=1).
    if not any(e.get("name") == "CYCLE_START" and e.get("s") == "g" for e in events):
        bad.append("no CYCLE_START marks")
# Fused tensors share one collective: their ALLREDUCE phases overlap.
grads = {tid for name, tid in rows.items() if name.startswith("tl/grad.")}
running, overlaps = set(), 0
for e in events:
    if e.get("tid") in grads and e.get("ph") == "B" and e.get("name") == "ALLREDUCE":
        overlaps += 1 if running else 0
        running.add(e["tid"])
    elif e.get("ph") == "E":
        running.discard(e.get("tid"))
if mode == "horovod" and np > 1 and overlaps == 0:
    bad.append("no fused allreduces at the default HOROVOD_FUSION_THRESHOLD")
if mode == "nofusion":
    # Written with HOROVOD_FUSION_THRESHOLD=0: every tensor runs alone.
    if overlaps:
        bad.append("%d fused allreduces with HOROVOD_FUSION_THRESHOLD=0" % overlaps)
    if "ALLREDUCE" not in [n for ph, n in phases(rows.get("tl/grad.3", -1)) if ph == "B"]:
        bad.append("tl/grad.3 has no ALLREDUCE phase")
if bad:
    print("FAIL timeline/%s_phases: %s" % (mode, "; ".join(bad[:5]))); sys.exit(1)
print("PASS timeline/%s_phases" % mode)
PY
}

HORA_TIMELINE_MARK_CYCLES=1 timeout -k 10 120 "$MPIEXEC" $flags -np "$np" \
  "$builddir/tests/mpi/test_timeline" </dev/null "$work/finalize.json" finalize >"$work/out" 2>&1
if [ $? -ne 0 ]; then
  echo "FAIL timeline/workload: exit status"
  tail -n 20 "$work/out"
else
  grep '^PASS\|^FAIL' "$work/out"
fi
check "$work/finalize.json" finalize
timeout -k 10 120 "$MPIEXEC" $flags -np "$np" "$builddir/tests/mpi/test_timeline" </dev/null \
  "$work/die.json" die >"$work/out" 2>&1
check "$work/die.json" killed
timeout -k 10 120 "$MPIEXEC" $flags -np "$np" "$builddir/tests/mpi/test_timeline" </dev/null \
  "$work/full.json" full >"$work/out" 2>&1
if [ $? -ne 0 ] || ! grep -q "HORA_TIMELINE: write failed .*the timeline stops here" "$work/out"; then
  echo "FAIL timeline/write_failure_warned: exit status or no warning"
  tail -n 20 "$work/out"
else
  echo "PASS timeline/write_failure_warned"
fi
check "$work/full.json" full

# Horovod's names for the same settings (the HORA_ ones unset).
hvd_run() { # file mode [VAR=value...]
  f=$1 m=$2
  shift 2
  env -u HORA_TIMELINE -u HORA_TIMELINE_MARK_CYCLES -u HORA_FUSION_THRESHOLD "$@" \
    timeout -k 10 120 "$MPIEXEC" $flags -np "$np" "$builddir/tests/mpi/test_timeline" </dev/null \
    "$f" "$m" >"$work/out" 2>&1
  if [ $? -ne 0 ]; then
    echo "FAIL timeline/horovod_${m}_workload: exit status"
    tail -n 20 "$work/out"
  fi
}
hvd_run "$work/hvd.json" horovod HOROVOD_TIMELINE_MARK_CYCLES=1
check "$work/hvd.json" horovod
hvd_run "$work/nofusion.json" horovod HOROVOD_FUSION_THRESHOLD=0
check "$work/nofusion.json" nofusion

check_runtime() { # file mode: runtime (the first file), second, third
  python3 - "$1" "$2" "$np" <<'PY'
import json, sys
path, mode, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    events = json.load(open(path))
except Exception as e:
    print("FAIL timeline/%s_valid_json: %s" % (mode, e)); sys.exit(1)
print("PASS timeline/%s_valid_json (%d events)" % (mode, len(events)))
rows = {e["args"]["name"]: e["tid"] for e in events if e.get("ph") == "M"}
bad = []
for name, tid in rows.items():
    depth = 0
    for e in events:
        if e.get("tid") == tid and e.get("ph") in ("B", "E"):
            depth += 1 if e["ph"] == "B" else -1
            if depth < 0:
                bad.append("unbalanced end on row %s" % name)
    if depth != 0:
        bad.append("row %s ends with %d open phases" % (name, depth))
want = {"runtime": ["tl/grad.3", "tl/lone", "tl/bcast", "tl/gather", "tl/open"],
        "second": ["tl/second"], "third": ["tl/third"]}[mode]
for name in want:
    if name not in rows:
        bad.append("no row %s" % name)
for name in ("tl/between", "tl/third" if mode != "third" else "tl/second",
             "tl/grad.3" if mode != "runtime" else "tl/second"):
    if name in rows:
        bad.append("row %s does not belong in this file" % name)
cycles = [e["args"]["cycle"] for e in events if e.get("name") == "CYCLE_START"]
if mode == "runtime":
    if not cycles or cycles != sorted(cycles) or len(set(cycles)) != len(cycles):
        bad.append("CYCLE_START marks %s" % cycles[:10])
    # Stopped while rank 0 alone had submitted it: negotiation began, ended at the stop.
    seq = [(e["ph"], e.get("name")) for e in events if e.get("tid") == rows.get("tl/open")]
    if np > 1 and ("B", "NEGOTIATE_ALLREDUCE") not in seq:
        bad.append("tl/open: %s" % seq)
elif cycles:
    bad.append("%d CYCLE_START marks without mark_cycles" % len(cycles))
ts = [e["ts"] for e in events if "ts" in e]
if any(b < a for a, b in zip(ts, ts[1:])):
    bad.append("timestamps go backwards")
if bad:
    print("FAIL timeline/%s_phases: %s" % (mode, "; ".join(bad[:5]))); sys.exit(1)
print("PASS timeline/%s_phases" % mode)
PY
}

timeout -k 10 120 "$MPIEXEC" $flags -np "$np" "$builddir/tests/mpi/test_timeline" </dev/null \
  "$work/rt.json" runtime >"$work/out" 2>&1
if [ $? -ne 0 ]; then
  echo "FAIL timeline/runtime_workload: exit status"
  tail -n 20 "$work/out"
else
  grep '^PASS\|^FAIL' "$work/out"
fi
check_runtime "$work/rt.json" runtime
check_runtime "$work/rt.json.2" second
check_runtime "$work/rt.json.3" third
if ls "$work"/rt.json.rank* >/dev/null 2>&1; then
  echo "FAIL timeline/only_rank_0_writes: $(ls "$work"/rt.json.rank*)"
else
  echo "PASS timeline/only_rank_0_writes"
fi
# HOROVOD_TIMELINE=DYNAMIC: no file until hora_start_timeline (none named
# DYNAMIC either), which then writes as without it.
mkdir "$work/dyn"
(cd "$work/dyn" && env -u HORA_TIMELINE HOROVOD_TIMELINE=DYNAMIC \
  timeout -k 10 120 "$MPIEXEC" $flags -np "$np" "$builddir/tests/mpi/test_timeline" </dev/null \
  "$work/dyn.json" runtime >"$work/out" 2>&1)
if [ $? -ne 0 ]; then
  echo "FAIL timeline/horovod_dynamic_workload: exit status"
  tail -n 20 "$work/out"
fi
check_runtime "$work/dyn.json" runtime
if [ -n "$(ls -A "$work/dyn")" ]; then
  echo "FAIL timeline/horovod_dynamic_writes_no_file: $(ls -A "$work/dyn")"
else
  echo "PASS timeline/horovod_dynamic_writes_no_file"
fi
