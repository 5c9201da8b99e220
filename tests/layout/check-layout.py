#!/usr/bin/python3
"""The layers the folders stand for, checked from the sources.

Each folder of the library has a place in one order, lowest first; a file
may include only headers of its own folder or of folders lower in the
order, so the include graph between folders has no cycle and no layer
reaches up. Also: no file of the library is much over 800 lines, and the
transports are reached by name and vtable only (their definitions are
declared in comm/transport/builtin.h, for the transport folder alone).
Prints PASS/FAIL lines. usage: check-layout.py SRCDIR
"""
import os
import re
import sys

LAYERS = [
    "base",               # errors, log, settings, table, wire: uses nothing of ours
    "comm/reduce",        # element-wise kernels
    "comm/transport",     # the vtable, progress, sockets, control connections, tcp, mock
    "comm/transport/ib",  # RDMA verbs
    "comm/shm",           # the host's shared segment, hora_mem_alloc blocks, path tuner
    "comm",               # comm.h: communicators and the process
    "comm/coll",          # the algorithm table and the host algorithms
    "comm/gpu",           # the device backend (NCCL, staging, kernels)
    "comm/bootstrap",     # rendezvous (MPI, tcp, env, slurm) and the connection plan
    "comm/communicator",  # a communicator built from a membership
    "runtime",            # runtime.h (the structs all of the runtime shares), operation.h, topology
    "runtime/observe",    # timeline, verify: the engine calls them; they call nothing above
    "runtime/negotiate",  # messages, the cache, cycle partners, the controller, fusion
    "runtime/engine",     # the coordinator: its loop, control traffic, cycles, execution, stalls, fatal path
    "runtime/api",        # the entry points, requests, groups, process sets, init
]
MAX_LINES = 820
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "."
    rank = {d: i for i, d in enumerate(LAYERS)}
    fails = {"layers": [], "size": [], "transports": []}
    files = []
    for top in ("base", "comm", "runtime"):
        for d, _, names in os.walk(os.path.join(src, top)):
            for n in names:
                if n.endswith((".c", ".h", ".cu", ".def")):
                    files.append(os.path.relpath(os.path.join(d, n), src))
    for f in sorted(files):
        folder = os.path.dirname(f)
        if folder not in rank:
            fails["layers"].append(f"{f}: folder {folder} has no place in the layer order")
            continue
        text = open(os.path.join(src, f), encoding="utf-8", errors="replace").read()
        for inc in INCLUDE.findall(text):
            if inc in ("config.h", "hora.h", "hora_cuda.h", "hora_mpi.h"):
                continue
            to = os.path.dirname(inc)
            if to not in rank:
                fails["layers"].append(f"{f}: includes \"{inc}\", not named from the top of the tree")
            elif rank[to] > rank[folder]:
                fails["layers"].append(f"{f} ({folder}) includes {inc} from the higher layer {to}")
            if inc == "comm/transport/builtin.h" and not folder.startswith("comm/transport"):
                fails["transports"].append(f"{f} includes the transports' own definitions")
        if not f.endswith(".def"):
            lines = text.count("\n")
            if lines > MAX_LINES:
                fails["size"].append(f"{f}: {lines} lines")
        if not folder.startswith("comm/transport"):
            for m in re.findall(r"hora__transport_(?:tcp|ib|mock)\b|hora__tcp_\w+|hora__ib_\w+", text):
                fails["transports"].append(f"{f}: names {m}")
    checks = [
        ("layers", "layout/includes_follow_the_layer_order"),
        ("size", "layout/no_file_over_800_lines"),
        ("transports", "layout/transports_only_through_the_vtable"),
    ]
    bad = 0
    for key, name in checks:
        if fails[key]:
            bad += 1
            print(f"FAIL {name}: " + "; ".join(fails[key][:20]))
        else:
            print(f"PASS {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
