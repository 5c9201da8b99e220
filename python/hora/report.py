"""Reads hora's timeline (HORA_TIMELINE: a Chrome trace-event JSON array
written by rank 0) and sums it up: where operations waited, which ranks came
late, how many tensors each collective carried, the bus bandwidth it reached,
and the time of each training step. hora-report prints and plots these; the
functions here are importable without matplotlib (plots.py needs it).

What the file holds (runtime/observe/timeline.c): one row (tid) per tensor,
named by a thread_name metadata event; on it B/E phases NEGOTIATE_<KIND>
(args {"cached": true} when the response cache scheduled it, whose
"rank N ready" marks then come all at once), QUEUE, and the run's phases
(MEMCPY_IN_FUSION_BUFFER, the collective, MEMCPY_OUT_FUSION_BUFFER), whose
args name the run: {"batch", "op", "tensors", "bytes", "batch_bytes",
"ranks", "dtype"}. Global instant events: CYCLE_START {"cycle"}, STEP
{"step", "seconds", "compute_seconds", "wait_seconds", "bytes"} at each
hora_step_mark, LAST_RANK {"rank", "waited_seconds", "operations"}.
"""
import json
import statistics

__all__ = ["load", "parse_text", "analyze", "Timeline", "bus_factor", "busbw_table",
           "summary"]


def parse_text(text):
    """The events of a trace's text, and whether it ended early.

    Accepts the JSON array hora writes and the {"traceEvents": [...]} form;
    a file cut mid-write (a job killed while copying it, a full disk) gives
    the events before the cut, with truncated True."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if isinstance(data, list):
        return [e for e in data if isinstance(e, dict)], False
    # Decode one event at a time up to the first that does not parse.
    events = []
    decoder = json.JSONDecoder()
    at = text.find("[")
    if at < 0:
        return events, True
    at += 1
    n = len(text)
    while True:
        while at < n and text[at] in " \t\r\n,":
            at += 1
        if at >= n or text[at] == "]":
            return events, at >= n
        try:
            event, at = decoder.raw_decode(text, at)
        except ValueError:
            return events, True
        if isinstance(event, dict):
            events.append(event)


def load(path):
    """(events, truncated) of the timeline file at path."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return parse_text(f.read())


def bus_factor(op, ranks):
    """What a collective of `op` moves per rank, as a multiple of its size
    (the nccl-tests convention hora-bench uses); 0 where nothing moves."""
    if ranks < 2:
        return 0.0
    if op == "allreduce":
        return 2.0 * (ranks - 1) / ranks
    if op == "broadcast":
        return 1.0
    return (ranks - 1) / ranks


class Op:
    """One operation on one tensor's row, negotiation to its run's end."""

    def __init__(self, name, kind, start):
        self.name = name
        self.kind = kind        # from NEGOTIATE_<KIND>, lower case; None if unseen
        self.start = start      # us: its negotiation began (or its first event)
        self.end = start
        self.negotiate_us = 0.0
        self.queue_us = 0.0
        self.cached = False
        self.marks = {}         # rank -> us of "rank N ready"
        self.batch = None


class Batch:
    """One run of a response: a collective, and the tensors fused into it."""

    def __init__(self, batch_id, args, ts):
        self.id = batch_id
        self.op = str(args.get("op", "?"))
        self.tensors = int(args.get("tensors", 1))
        self.bytes = int(args.get("batch_bytes", args.get("bytes", 0)))
        self.ranks = int(args.get("ranks", 0))
        self.dtype = args.get("dtype")
        self.start = ts
        self.end = ts
        self.names = set()

    @property
    def seconds(self):
        return max(self.end - self.start, 0.0) / 1e6

    @property
    def moved_bytes(self):
        """The size bus bandwidth is measured on: an allgather's whole
        gathered buffer (its args count each rank's part)."""
        return self.bytes * self.ranks if self.op == "allgather" else self.bytes

    def busbw(self):
        """GB/s, or None where it says nothing (one rank, no time)."""
        f = bus_factor(self.op, self.ranks)
        if f == 0 or self.seconds <= 0 or self.bytes <= 0:
            return None
        return self.moved_bytes / self.seconds / 1e9 * f


class Timeline:
    """What analyze() found in a list of events."""

    def __init__(self):
        self.events = 0
        self.truncated = False
        self.rows = {}          # tid -> tensor name
        self.ops = []
        self.batches = {}       # id -> Batch
        self.steps = []         # STEP args, with "ts"
        self.last_rank = []     # LAST_RANK args, with "ts"
        self.cycles = 0
        self.first_ts = None
        self.last_ts = None
        self.open_phases = 0    # begun and never ended (a file cut short)
        self.ranks = 0

    @property
    def span_seconds(self):
        if self.first_ts is None:
            return 0.0
        return (self.last_ts - self.first_ts) / 1e6

    def operations_by_kind(self):
        """Tensors run per collective kind, as hora_get_stats counts them
        (a fused batch of k tensors is k operations)."""
        out = {}
        for b in self.batches.values():
            out[b.op] = out.get(b.op, 0) + b.tensors
        return out

    def fused(self):
        """(batches of more than one tensor, tensors in them)."""
        fused = [b for b in self.batches.values() if b.tensors > 1]
        return len(fused), sum(b.tensors for b in fused)

    def batch_histogram(self):
        """{tensors per collective: how many collectives}."""
        out = {}
        for b in self.batches.values():
            out[b.tensors] = out.get(b.tensors, 0) + 1
        return dict(sorted(out.items()))

    def total_bytes(self):
        return sum(b.bytes for b in self.batches.values())

    def waits(self):
        """Per tensor name: [operations, negotiation us, queue us], most
        waited first."""
        per = {}
        for op in self.ops:
            w = per.setdefault(op.name, [0, 0.0, 0.0])
            w[0] += 1
            w[1] += op.negotiate_us
            w[2] += op.queue_us
        return sorted(per.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))

    def lateness_from_marks(self):
        """From full negotiations whose "rank N ready" marks came from two or
        more ranks: (operations used, {rank: {"last": times it was last,
        "after_first_us": [its delay after the first rank, per operation]}},
        cached operations skipped)."""
        per, used, cached = {}, 0, 0
        for op in self.ops:
            if op.cached:
                cached += 1
                continue
            if len(op.marks) < 2:
                continue
            used += 1
            first = min(op.marks.values())
            last_rank = max(op.marks, key=lambda r: (op.marks[r], r))
            for rank, ts in op.marks.items():
                d = per.setdefault(rank, {"last": 0, "after_first_us": []})
                d["after_first_us"].append(ts - first)
            per[last_rank]["last"] += 1
        return used, dict(sorted(per.items())), cached

    def lateness_from_last_rank(self):
        """From LAST_RANK events: {rank: {"cycles", "waited_seconds",
        "operations"}}."""
        per = {}
        for e in self.last_rank:
            try:
                rank = int(e.get("rank"))
            except (TypeError, ValueError):
                continue
            d = per.setdefault(rank, {"cycles": 0, "waited_seconds": 0.0, "operations": 0})
            d["cycles"] += 1
            d["waited_seconds"] += float(e.get("waited_seconds", 0) or 0)
            d["operations"] += int(e.get("operations", 0) or 0)
        return dict(sorted(per.items()))

    def bursts(self, gap_us):
        """Steps guessed from the operations alone: runs of operations with
        less than gap_us between one's end and the next's start. Each is a
        dict: start, end, last_submit (the latest negotiation start: after
        it the caller had nothing left to submit), operations, and
        exposed_us = end - last_submit, the communication not overlapped
        with anything the caller still had to do."""
        spans = sorted((op.start, op.end) for op in self.ops)
        out = []
        for start, end in spans:
            if out and start - out[-1]["end"] < gap_us:
                b = out[-1]
                b["end"] = max(b["end"], end)
                b["last_submit"] = max(b["last_submit"], start)
                b["operations"] += 1
            else:
                out.append({"start": start, "end": end, "last_submit": start, "operations": 1})
        for b in out:
            b["exposed_us"] = b["end"] - b["last_submit"]
        return out


def _num(x, default=0.0):
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def analyze(events, truncated=False):
    """A Timeline from the events of one file, in file order."""
    tl = Timeline()
    tl.events = len(events)
    tl.truncated = truncated
    current = {}   # tid -> the Op on that row now
    stacks = {}    # tid -> [(phase, ts, args)] of open phases
    for e in events:
        ph, name, tid = e.get("ph"), e.get("name"), e.get("tid")
        ts = e.get("ts")
        if ph == "M":
            if name == "thread_name" and isinstance(e.get("args"), dict):
                tl.rows[tid] = str(e["args"].get("name", tid))
            continue
        if not isinstance(ts, (int, float)):
            continue
        tl.first_ts = ts if tl.first_ts is None else min(tl.first_ts, ts)
        tl.last_ts = ts if tl.last_ts is None else max(tl.last_ts, ts)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if ph in ("i", "I") and e.get("s") == "g":
            if name == "STEP":
                tl.steps.append(dict(args, ts=ts))
            elif name == "LAST_RANK":
                tl.last_rank.append(dict(args, ts=ts))
            elif name == "CYCLE_START":
                tl.cycles += 1
            continue
        row = tl.rows.get(tid, str(tid))
        stack = stacks.setdefault(tid, [])
        op = current.get(tid)
        if ph == "B":
            phase = str(name)
            if phase.startswith("NEGOTIATE") or op is None:
                kind = phase[len("NEGOTIATE_"):].lower() if phase.startswith("NEGOTIATE_") else None
                op = Op(row, kind, ts)
                tl.ops.append(op)
                current[tid] = op
                if args.get("cached"):
                    op.cached = True
            if "batch" in args:
                bid = args["batch"]
                batch = tl.batches.get(bid)
                if batch is None:
                    batch = tl.batches[bid] = Batch(bid, args, ts)
                batch.start = min(batch.start, ts)
                batch.names.add(row)
                op.batch = bid
                tl.ranks = max(tl.ranks, batch.ranks)
            stack.append((phase, ts, args))
            op.end = max(op.end, ts)
        elif ph == "E":
            if not stack:
                continue
            phase, began, bargs = stack.pop()
            if op is not None:
                if phase.startswith("NEGOTIATE"):
                    op.negotiate_us += ts - began
                elif phase == "QUEUE":
                    op.queue_us += ts - began
                op.end = max(op.end, ts)
            if "batch" in bargs and bargs["batch"] in tl.batches:
                b = tl.batches[bargs["batch"]]
                b.end = max(b.end, ts)
        elif ph in ("i", "I") and isinstance(name, str) and name.startswith("rank ") \
                and name.endswith(" ready") and op is not None:
            try:
                rank = int(name.split()[1])
            except ValueError:
                continue
            op.marks.setdefault(rank, ts)
            tl.ranks = max(tl.ranks, rank + 1)
    tl.open_phases = sum(len(s) for s in stacks.values())
    tl.steps.sort(key=lambda s: s["ts"])
    return tl


def size_bucket(nbytes):
    """The power of two at or below nbytes (message sizes are grouped so)."""
    b = 1
    while b * 2 <= nbytes:
        b *= 2
    return b


def busbw_table(tl):
    """{(op, size bucket): [median GB/s, batches]}, by op and size."""
    groups = {}
    for b in tl.batches.values():
        bw = b.busbw()
        if bw is not None:
            groups.setdefault((b.op, size_bucket(b.moved_bytes)), []).append(bw)
    return {k: [statistics.median(v), len(v)] for k, v in sorted(groups.items())}


def step_rows(tl, gap_us):
    """The steps, as dicts of seconds: from STEP events when the timeline
    has them ("source": "STEP"), else from bursts of operations ("source":
    "bursts", compute = the idle gap until the next burst, wait = exposed
    communication, other = the rest of the burst)."""
    if tl.steps:
        rows = []
        for s in tl.steps:
            total = _num(s.get("seconds"))
            compute = _num(s.get("compute_seconds"))
            wait = _num(s.get("wait_seconds"))
            rows.append({"step": int(_num(s.get("step"), len(rows))), "ts": s["ts"],
                         "seconds": total, "compute": compute, "wait": wait,
                         "other": max(total - compute - wait, 0.0),
                         "bytes": int(_num(s.get("bytes")))})
        return "STEP", rows
    bursts = tl.bursts(gap_us)
    rows = []
    for i, b in enumerate(bursts):
        nxt = bursts[i + 1]["start"] if i + 1 < len(bursts) else None
        busy = (b["end"] - b["start"]) / 1e6
        wait = b["exposed_us"] / 1e6
        rows.append({"step": i, "ts": b["start"],
                     "seconds": (nxt - b["start"]) / 1e6 if nxt is not None else busy,
                     "compute": (nxt - b["end"]) / 1e6 if nxt is not None else 0.0,
                     "wait": wait, "other": max(busy - wait, 0.0),
                     "operations": b["operations"]})
    return "bursts", rows


def summary(tl, gap_us=5000.0):
    """The numbers hora-report prints, as plain data (also its --json)."""
    fused_batches, fused_tensors = tl.fused()
    used, marks, cached = tl.lateness_from_marks()
    source, steps = step_rows(tl, gap_us)
    waits = tl.waits()
    return {
        "events": tl.events,
        "truncated": tl.truncated,
        "open_phases": tl.open_phases,
        "seconds": tl.span_seconds,
        "ranks": tl.ranks,
        "rows": len(tl.rows),
        "operations": sum(tl.operations_by_kind().values()),
        "operations_by_kind": tl.operations_by_kind(),
        "negotiations": len(tl.ops),
        "cached_negotiations": cached,
        "collectives": len(tl.batches),
        "bytes": tl.total_bytes(),
        "fused_batches": fused_batches,
        "fused_tensors": fused_tensors,
        "batch_histogram": {str(k): v for k, v in tl.batch_histogram().items()},
        "cycles": tl.cycles,
        "top_waits": [{"name": n, "operations": w[0], "negotiate_seconds": w[1] / 1e6,
                       "queue_seconds": w[2] / 1e6} for n, w in waits[:10]],
        "lateness_marks": {"operations": used,
                           "ranks": {str(r): {"last": d["last"],
                                              "mean_after_first_seconds":
                                                  statistics.mean(d["after_first_us"]) / 1e6,
                                              "max_after_first_seconds":
                                                  max(d["after_first_us"]) / 1e6}
                                     for r, d in marks.items()}},
        "lateness_last_rank": {str(r): d for r, d in tl.lateness_from_last_rank().items()},
        "steps_source": source,
        "steps": steps,
        "busbw": [{"op": op, "bytes": size, "median_gbps": v[0], "collectives": v[1]}
                  for (op, size), v in busbw_table(tl).items()],
    }
