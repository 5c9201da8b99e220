#!/usr/bin/python3
"""Draws hora-bench --csv results: bus bandwidth against message size,
log-log, hora beside the peer measured in the same run (MPI or NCCL), one
panel per collective.

usage: scripts/plot-bench.py [-o OUT.png] [--title TEXT] [LABEL=]FILE.csv...
  several files (e.g. one host and fake hosts) share the panels, each
  series named "impl (LABEL)"; LABEL defaults to the file's name.

  mpirun -np 4 hora-bench -o allreduce --csv one-host.csv
  scripts/plot-bench.py -o busbw.png one-host.csv
"""
import argparse
import csv
import os
import sys

COLUMNS = ("op", "bytes", "count", "ranks", "impl", "time_us", "algbw_gbps", "busbw_gbps",
           "errors")


def read(path):
    """Rows of one CSV, numbers converted; raises ValueError on a bad file."""
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        if tuple(r.fieldnames or ()) != COLUMNS:
            raise ValueError("%s: header %s, expected %s" % (path, r.fieldnames, ",".join(COLUMNS)))
        rows = []
        for row in r:
            row["bytes"] = int(row["bytes"])
            row["ranks"] = int(row["ranks"])
            row["busbw_gbps"] = float(row["busbw_gbps"])
            row["time_us"] = float(row["time_us"])
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", metavar="[LABEL=]FILE.csv")
    ap.add_argument("-o", "--output", default="bench-busbw.png", help="the PNG to write")
    ap.add_argument("--title", help="the figure's title")
    a = ap.parse_args(argv)
    series = []  # (label, rows)
    for spec in a.files:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        label = label or os.path.splitext(os.path.basename(path))[0]
        try:
            series.append((label, read(path)))
        except (OSError, ValueError) as e:
            print("plot-bench.py: %s" % e, file=sys.stderr)
            return 1
    ops = []
    for _, rows in series:
        for row in rows:
            if row["op"] not in ops:
                ops.append(row["op"])
    if not ops:
        print("plot-bench.py: no rows to plot", file=sys.stderr)
        return 1
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = min(len(ops), 3)
    nrows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    styles = {"hora": "-o", "MPI": "--s", "NCCL": "--^"}
    for i, op in enumerate(ops):
        ax = axes[i // cols][i % cols]
        for label, rows in series:
            impls = []
            for row in rows:
                if row["op"] == op and row["impl"] not in impls:
                    impls.append(row["impl"])
            for impl in impls:
                pts = sorted((r["bytes"], r["busbw_gbps"]) for r in rows
                             if r["op"] == op and r["impl"] == impl and r["busbw_gbps"] > 0)
                if pts:
                    name = impl if len(series) == 1 else "%s (%s)" % (impl, label)
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(impl, "-x"),
                            markersize=4, label=name)
        ranks = sorted({r["ranks"] for _, rows in series for r in rows if r["op"] == op})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("%s, %s ranks" % (op, "/".join(str(n) for n in ranks)))
        ax.set_xlabel("message bytes")
        ax.set_ylabel("bus bandwidth GB/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    for j in range(len(ops), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=80)
    print("plot-bench.py: wrote %s" % a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
