"""Unit tests of hora.report (the parser behind hora-report) on synthetic
timelines: with and without STEP and LAST_RANK events, cached and full
negotiations, and files cut short. With a path to hora-report as argv[1],
also runs it on them: it must exit 0, plot what there is, and say why it
skips the rest. Prints PASS/FAIL lines.

usage: /usr/bin/python3 test_report_parse.py [HORA_REPORT]   (PYTHONPATH=python)
"""
import json
import os
import subprocess
import sys
import tempfile
import traceback

from hora import report

failures = 0


def case(fn):
    global failures
    try:
        fn()
        print("PASS reports/parse_%s" % fn.__name__)
    except Exception as e:  # noqa: BLE001 - every failure becomes a FAIL line
        failures += 1
        where = traceback.extract_tb(e.__traceback__)[-1]
        print("FAIL reports/parse_%s: %s (line %d)" % (fn.__name__, e or type(e).__name__,
                                                       where.lineno))


def eq(got, want, what):
    if got != want:
        raise AssertionError("%s: got %r, expected %r" % (what, got, want))


class Trace:
    """Events as runtime/observe/timeline.c writes them."""

    def __init__(self, ranks=4):
        self.events, self.rows, self.ranks, self.batch = [], {}, ranks, 0

    def row(self, name):
        if name not in self.rows:
            self.rows[name] = len(self.rows)
            self.events.append({"name": "thread_name", "ph": "M", "pid": 0,
                                "tid": self.rows[name], "args": {"name": name}})
        return self.rows[name]

    def ev(self, name, ph, ts, what=None, args=None):
        e = {"ph": ph, "pid": 0, "tid": self.row(name), "ts": float(ts)}
        if what:
            e["name"] = what
        if ph == "i":
            e["s"] = "t"
        if args is not None:
            e["args"] = args
        self.events.append(e)

    def glob(self, what, ts, args):
        self.events.append({"name": what, "ph": "i", "s": "g", "pid": 0, "ts": float(ts),
                            "args": args})

    def negotiate(self, name, ts, ready, kind="ALLREDUCE", cached=False):
        """Negotiation from ts; ready: {rank: us after ts}; then QUEUE."""
        self.ev(name, "B", ts, "NEGOTIATE_" + kind, {"cached": True} if cached else None)
        for rank, d in sorted(ready.items(), key=lambda kv: kv[1]):
            self.ev(name, "i", ts + d, "rank %d ready" % rank)
        end = ts + max(ready.values())
        self.ev(name, "E", end)
        self.ev(name, "B", end, "QUEUE")
        return end

    def run(self, names, ts, us, op="allreduce", nbytes=1024, phase="ALLREDUCE"):
        """One collective over `names` (ends their QUEUE at ts), us long."""
        self.batch += 1
        for n in names:
            self.ev(n, "E", ts)
        for n in names:
            self.ev(n, "B", ts, phase, {"batch": self.batch, "op": op, "tensors": len(names),
                                        "bytes": nbytes, "batch_bytes": nbytes * len(names),
                                        "ranks": self.ranks, "dtype": "float32"})
        for n in names:
            self.ev(n, "E", ts + us)

    def text(self):
        return "[\n" + ",\n".join(json.dumps(e, separators=(",", ":"))
                                  for e in self.events) + "\n]\n"


def two_steps(with_marks=True):
    """Two steps 50 ms apart: a fused allreduce of three gradients and a lone
    broadcast; the first step negotiated in full (rank 2 last, 300 us after
    rank 0), the second from the cache."""
    t = Trace()
    for step in range(2):
        base = step * 50000.0
        cached = step == 1
        ready = {0: 0, 1: 40, 2: 300, 3: 100} if not cached else {0: 0, 1: 0, 2: 0, 3: 0}
        names = ["g.%d" % k for k in range(3)]
        for k, n in enumerate(names):
            t.negotiate(n, base + 10 * k, ready, cached=cached)
        t.run(names, base + 400, 200, nbytes=4096)
        t.negotiate("b", base + 700, ready, kind="BROADCAST", cached=cached)
        t.run(["b"], base + 1000, 100, op="broadcast", nbytes=512, phase="BROADCAST")
        if with_marks:
            t.glob("CYCLE_START", base, {"cycle": step + 1})
    return t


@case
def without_step_events():
    tl = report.analyze(json.loads(two_steps().text()))
    eq(tl.operations_by_kind(), {"allreduce": 6, "broadcast": 2}, "operations by kind")
    eq(tl.fused(), (2, 6), "fused batches and tensors")
    eq(tl.batch_histogram(), {1: 2, 3: 2}, "tensors per collective")
    eq(tl.total_bytes(), 2 * (3 * 4096 + 512), "bytes")
    eq(tl.cycles, 2, "CYCLE_START marks")
    eq(tl.ranks, 4, "ranks")
    used, marks, cached = tl.lateness_from_marks()
    eq((used, cached), (4, 4), "full and cached negotiations")
    eq({r: d["last"] for r, d in marks.items()}, {0: 0, 1: 0, 2: 4, 3: 0}, "times last")
    eq(marks[2]["after_first_us"], [300.0] * 4, "rank 2's lateness")
    eq(tl.lateness_from_last_rank(), {}, "no LAST_RANK events")
    s = report.summary(tl, gap_us=5000)
    eq(s["steps_source"], "bursts", "steps from bursts")
    eq(len(s["steps"]), 2, "two bursts")
    # The last submission (the broadcast's negotiation at 700 us) to the
    # burst's end (its run ends at 1100 us).
    eq(round(s["steps"][0]["wait"] * 1e6), 400, "exposed communication of step 0")
    eq(round(s["steps"][0]["seconds"] * 1e6), 50000, "step 0 lasts until step 1 starts")
    top = s["top_waits"][0]
    eq(top["name"], "g.0", "the tensor that waited longest")
    # g.0: full negotiation 300 us + queue 100 us (300 -> 400); cached: 0 + 400.
    eq(round((top["negotiate_seconds"] + top["queue_seconds"]) * 1e6), 800, "g.0's wait")
    bw = {(b["op"], b["bytes"]): b for b in s["busbw"]}
    # 12 KiB allreduce in 200 us at 4 ranks: 12288 / 200e-6 * 1.5 / 1e9 GB/s.
    eq(round(bw[("allreduce", 8192)]["median_gbps"], 4), round(12288 / 200e-6 * 1.5 / 1e9, 4),
       "allreduce busbw")
    eq(round(bw[("broadcast", 512)]["median_gbps"], 4), round(512 / 100e-6 / 1e9, 4),
       "broadcast busbw")


@case
def with_step_and_last_rank_events():
    t = two_steps()
    for step in range(3):
        t.glob("STEP", 50000.0 * step + 49000, {"step": step, "seconds": 0.05,
                                                "compute_seconds": 0.04, "wait_seconds": 0.002,
                                                "bytes": 12800})
    t.glob("LAST_RANK", 420, {"rank": 3, "waited_seconds": 0.0015, "operations": 3})
    t.glob("LAST_RANK", 50420, {"rank": 3, "waited_seconds": 0.0005, "operations": 1})
    t.glob("LAST_RANK", 50800, {"rank": 1, "waited_seconds": 0.001, "operations": 1})
    tl = report.analyze(json.loads(t.text()))
    s = report.summary(tl)
    eq(s["steps_source"], "STEP", "steps from STEP events")
    eq([r["step"] for r in s["steps"]], [0, 1, 2], "step numbers")
    r = s["steps"][1]
    eq((r["compute"], r["wait"], round(r["other"], 6), r["bytes"]), (0.04, 0.002, 0.008, 12800),
       "step 1's breakdown")
    lr = tl.lateness_from_last_rank()
    eq(sorted(lr), [1, 3], "ranks named by LAST_RANK")
    eq((lr[3]["cycles"], round(lr[3]["waited_seconds"], 6), lr[3]["operations"]), (2, 0.002, 4),
       "rank 3's LAST_RANK sums")
    eq(s["lateness_last_rank"]["1"]["cycles"], 1, "rank 1's cycles in the summary")
    # The STEP events are global: they change no operation count.
    eq(tl.operations_by_kind(), {"allreduce": 6, "broadcast": 2}, "operations by kind")


@case
def truncated_file():
    text = two_steps().text()
    cut = text[:len(text) * 2 // 3]
    cut = cut[:cut.rstrip().rfind("{") + 9]  # mid-event
    events, truncated = report.parse_text(cut)
    eq(truncated, True, "truncated")
    whole = json.loads(text)
    eq(events, whole[:len(events)], "the events before the cut")
    if not 0 < len(events) < len(whole):
        raise AssertionError("%d of %d events read" % (len(events), len(whole)))
    tl = report.analyze(events, truncated)
    if tl.open_phases == 0:
        raise AssertionError("a cut file should leave phases open")
    report.summary(tl)  # must not raise
    # Cut between events, and after the opening bracket only.
    eq(report.parse_text(text[:text.rfind(",\n")])[0], whole[:-1], "cut between events")
    eq(report.parse_text("[\n"), ([], True), "only the bracket")
    eq(report.parse_text(""), ([], True), "empty")


@case
def trace_event_object_form():
    whole = json.loads(two_steps().text())
    events, truncated = report.parse_text(json.dumps({"traceEvents": whole}))
    eq((events, truncated), (whole, False), "the {\"traceEvents\": [...]} form")


@case
def one_rank_and_no_bursts():
    t = Trace(ranks=1)
    t.negotiate("x", 0, {0: 0})
    t.run(["x"], 10, 5)
    tl = report.analyze(json.loads(t.text()))
    s = report.summary(tl)
    eq(s["busbw"], [], "no bus bandwidth at one rank")
    eq(len(s["steps"]), 1, "one burst")
    eq(s["lateness_marks"]["operations"], 0, "no lateness from one rank's marks")


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError("%s is not a PNG" % path)
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def run_cli(tool, trace_text, name):
    d = tempfile.mkdtemp(prefix="hora-report-")
    path = os.path.join(d, name + ".json")
    with open(path, "w") as f:
        f.write(trace_text)
    p = subprocess.run([tool, path, "--json", os.path.join(d, "s.json")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        raise AssertionError("exit status %d: %s" % (p.returncode, out[-400:]))
    return d, out


if len(sys.argv) > 1:
    tool = sys.argv[1]

    @case
    def cli_plots_synthetic_with_steps():
        t = two_steps()
        for step in range(2):
            t.glob("STEP", 50000.0 * step + 49000, {"step": step, "seconds": 0.05,
                                                    "compute_seconds": 0.04,
                                                    "wait_seconds": 0.002, "bytes": 1})
        t.glob("LAST_RANK", 420, {"rank": 3, "waited_seconds": 0.0015, "operations": 3})
        d, out = run_cli(tool, t.text(), "steps")
        for what in ("steps", "lateness", "busbw"):
            w, h = png_size(os.path.join(d, "steps-%s.png" % what))
            if w < 200 or h < 200:
                raise AssertionError("%s plot %dx%d" % (what, w, h))
        if "per-rank lateness from LAST_RANK events" not in out or "2 STEP marks" not in out:
            raise AssertionError("summary lacks LAST_RANK or STEP lines:\n" + out)

    @case
    def cli_says_why_it_skips():
        t = Trace(ranks=1)
        t.negotiate("x", 0, {0: 0})
        t.run(["x"], 10, 5)
        d, out = run_cli(tool, t.text(), "lone")
        for want in ("the timeline has no STEP marks", "plot steps: skipped",
                     "plot lateness: skipped", "plot busbw: skipped"):
            if want not in out:
                raise AssertionError("no %r in:\n%s" % (want, out))

    @case
    def cli_reads_a_truncated_file():
        text = two_steps().text()
        d, out = run_cli(tool, text[:len(text) // 2], "cut")
        if "cut short" not in out:
            raise AssertionError("no word of the cut in:\n" + out)

sys.exit(1 if failures else 0)
