#!/usr/bin/python3
"""The metrics tests' client side, for check-metrics.sh. Prints PASS/FAIL
lines. Subcommands:
  freeport N                      a base port with N free ports after it
  scrape BASEPORT NP STATS        each rank's endpoint: parses (prometheus_client),
                                  its counters equal the rank's STATS line; saves
                                  the texts as STATS.rankR.prom for promtool
  files PATTERN NP STATS READS    the %r files: parse on every one of READS reads
                                  (written by rename, never half); final values
  prometheus API NP STATS TIMEOUT a Prometheus server's /api/v1/query agrees with
                                  every rank's STATS line
  bad PORT                        garbage, wrong method, wrong path, oversize
  flood PORT N SECONDS PID        N connections held open for SECONDS; the
                                  process PID's descriptors stay bounded
"""
import json
import os
import socket
import sys
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def stats_of(path):
    """rank -> {name: value} from the probe's STATS lines."""
    out = {}
    for line in open(path, errors="replace"):
        if line.startswith("STATS "):
            f = line.split()
            out[int(f[1])] = {k: int(v) for k, v in (x.split("=") for x in f[2:])}
    return out


def http_get(port, path="/metrics", timeout=10):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def values(text):
    """(name, frozenset(labels)) -> value, and {family: type}."""
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, types


def expected_from(samples, rank):
    """What the exposition says, in the STATS line's terms."""
    got = {"bytes": 0, "allreduce": 0, "broadcast": 0, "allgather": 0, "reducescatter": 0,
           "alltoall": 0}
    for (name, labels), v in samples.items():
        lab = dict(labels)
        if lab.get("rank") != str(rank):
            return None
        if name == "hora_operations_total":
            got[lab["kind"]] += int(v)
        elif name == "hora_operation_bytes_total":
            got["bytes"] += int(v)
        elif name == "hora_cache_hits_total":
            got["cache_hits"] = int(v)
        elif name == "hora_cache_misses_total":
            got["cache_misses"] = int(v)
        elif name == "hora_eager_allreduces_total":
            got["eager"] = int(v)
        elif name == "hora_fused_batches_total":
            got["fused_batches"] = int(v)
    return got


def diff(want, got):
    return ["%s: hora_get_stats %s, metrics %s" % (k, want[k], got.get(k))
            for k in sorted(want) if k != "cycles" and got.get(k) != want[k]]


def cmd_freeport(n):
    n = int(n)
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            t.close()
        if ok:
            print(base)
            return 0
    return 1


def cmd_scrape(base, np, stats_path):
    base, np = int(base), int(np)
    stats = stats_of(stats_path)
    bad_parse, bad_values, bad_type = [], [], []
    for r in range(np):
        try:
            code, ctype, text = http_get(base + r)
        except Exception as e:  # noqa: BLE001 - any failure is the test's
            bad_parse.append("rank %d: %s" % (r, e))
            continue
        with open("%s.rank%d.prom" % (stats_path, r), "w") as f:
            f.write(text)
        if ctype != "text/plain; version=0.0.4; charset=utf-8":
            bad_type.append("rank %d: %s" % (r, ctype))
        try:
            samples, types = values(text)
        except Exception as e:  # noqa: BLE001
            bad_parse.append("rank %d: %s" % (r, e))
            continue
        need = ["hora_info", "hora_operations", "hora_operation_bytes", "hora_stage_seconds",
                "hora_bus_bandwidth_bytes_per_second", "hora_process_cpu_seconds",
                "hora_process_resident_memory_bytes", "hora_negotiation_cycles",
                "hora_stall_warnings", "hora_peer_losses", "hora_elastic_resets"]
        missing = [n for n in need if n not in types]
        if missing:
            bad_parse.append("rank %d lacks %s" % (r, missing))
        if types.get("hora_bus_bandwidth_bytes_per_second") != "histogram":
            bad_parse.append("rank %d: bus bandwidth is not a histogram" % r)
        got = expected_from(samples, r)
        if r not in stats:
            bad_values.append("rank %d printed no STATS line" % r)
        elif got is None:
            bad_values.append("rank %d's endpoint labels another rank" % r)
        else:
            bad_values += ["rank %d %s" % (r, d) for d in diff(stats[r], got)]
    for name, bad in (("exposition_parses_with_prometheus_client", bad_parse),
                      ("content_type_0_0_4", bad_type),
                      ("endpoint_counters_equal_hora_get_stats", bad_values)):
        print(("FAIL metrics/%s: %s" % (name, "; ".join(bad[:5]))) if bad
              else "PASS metrics/%s (np=%d)" % (name, np))
    return 0


def cmd_files(pattern, np, stats_path, reads):
    np, reads = int(np), int(reads)
    paths = [pattern.replace("%r", str(r)) for r in range(np)]
    bad, n = [], 0
    for i in range(reads):
        for p in paths:
            try:
                text = open(p).read()
                values(text)
                if not text.endswith("\n") or "hora_operations_total" not in text:
                    bad.append("%s: incomplete on read %d" % (p, i))
                n += 1
            except FileNotFoundError:
                bad.append("%s: missing" % p)
            except Exception as e:  # noqa: BLE001
                bad.append("%s: %s" % (p, e))
        if len(bad) > 5:
            break
        time.sleep(0.02)
    print(("FAIL metrics/file_always_parses: %s" % "; ".join(bad[:5])) if bad
          else "PASS metrics/file_always_parses (%d reads of %d files named by %%r)" % (n, np))
    return 0


def cmd_files_final(pattern, np, stats_path):
    np = int(np)
    stats, bad = stats_of(stats_path), []
    for r in range(np):
        p = pattern.replace("%r", str(r))
        try:
            samples, _ = values(open(p).read())
        except Exception as e:  # noqa: BLE001
            bad.append("%s: %s" % (p, e))
            continue
        got = expected_from(samples, r)
        if got is None or r not in stats:
            bad.append("%s: not rank %d's, or no STATS line" % (p, r))
        else:
            bad += ["%s %s" % (p, d) for d in diff(stats[r], got)]
        leftovers = [f for f in os.listdir(os.path.dirname(p) or ".") if ".tmp." in f]
        if leftovers:
            bad.append("temporary files left: %s" % leftovers)
    print(("FAIL metrics/file_written_at_finalize: %s" % "; ".join(bad[:5])) if bad
          else "PASS metrics/file_written_at_finalize (final counters equal hora_get_stats)")
    return 0


def query(api, q):
    url = api + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    return {int(x["metric"].get("rank", -1)): int(float(x["value"][1]))
            for x in body["data"]["result"]}


def cmd_prometheus(api, np, stats_path, timeout):
    np, deadline = int(np), time.time() + float(timeout)
    stats = stats_of(stats_path)
    queries = {
        "allreduce": 'sum by (rank) (hora_operations_total{kind="allreduce"})',
        "broadcast": 'sum by (rank) (hora_operations_total{kind="broadcast"})',
        "allgather": 'sum by (rank) (hora_operations_total{kind="allgather"})',
        "reducescatter": 'sum by (rank) (hora_operations_total{kind="reducescatter"})',
        "bytes": "sum by (rank) (hora_operation_bytes_total)",
        "cache_hits": "sum by (rank) (hora_cache_hits_total)",
        "cache_misses": "sum by (rank) (hora_cache_misses_total)",
        "eager": "sum by (rank) (hora_eager_allreduces_total)",
    }
    last = "no answer"
    while time.time() < deadline:
        try:
            up = query(api, 'count(up{job="hora"} == 1)').get(-1, 0)
            got = {k: query(api, q) for k, q in queries.items()}
            bad = [] if up == np else ["%d of %d targets up" % (up, np)]
            for r in range(np):
                for k, per_rank in got.items():
                    if per_rank.get(r) != stats.get(r, {}).get(k):
                        bad.append("rank %d %s: hora_get_stats %s, Prometheus %s"
                                   % (r, k, stats.get(r, {}).get(k), per_rank.get(r)))
            if not bad:
                print("PASS metrics/prometheus_server_scrapes_equal_hora_get_stats (np=%d, %d "
                      "counters each)" % (np, len(queries)))
                return 0
            last = "; ".join(bad[:4])
        except Exception as e:  # noqa: BLE001 - not up yet, or no data yet
            last = str(e)
        time.sleep(1)
    print("FAIL metrics/prometheus_server_scrapes_equal_hora_get_stats: %s" % last)
    return 0


def raw(port, data, timeout=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    chunks = []
    while True:
        try:
            c = s.recv(65536)
        except socket.timeout:
            break
        if not c:
            break
        chunks.append(c)
    s.close()
    return b"".join(chunks)


def cmd_bad(port):
    port = int(port)
    cases = [
        ("garbage_is_400", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", b" 400 "),
        ("garbage_line_is_400", b"hello there\r\n\r\n", b" 400 "),
        ("post_is_405", b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b" 405 "),
        ("other_path_is_404", b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n", b" 404 "),
        ("oversized_request_is_431", b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 8000 + b"\r\n\r\n",
         b" 431 "),
    ]
    for name, data, want in cases:
        try:
            got = raw(port, data)
            ok = got.split(b"\r\n", 1)[0].find(want) > 0 and b"Connection: close" in got
            print("PASS metrics/%s" % name if ok else
                  "FAIL metrics/%s: answered %r" % (name, got[:80]))
        except Exception as e:  # noqa: BLE001
            print("FAIL metrics/%s: %s" % (name, e))
    # A client that says nothing is dropped at its deadline; the server
    # meanwhile answers others.
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        code, _, text = http_get(port)
        values(text)
        t0 = time.time()
        closed = idle.recv(1) == b""
        ok = code == 200 and closed and time.time() - t0 < 10
        print("PASS metrics/serves_after_bad_requests_and_drops_idle_clients" if ok else
              "FAIL metrics/serves_after_bad_requests_and_drops_idle_clients: code %s" % code)
    except Exception as e:  # noqa: BLE001
        print("FAIL metrics/serves_after_bad_requests_and_drops_idle_clients: %s" % e)
    idle.close()
    return 0


def fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def cmd_flood(port, n, seconds, pid):
    port, n, seconds, pid = int(port), int(n), float(seconds), int(pid)
    before = fds(pid)
    socks, refused, most = [], 0, before
    for i in range(n):
        try:
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            if i % 2:
                try:
                    s.send(b"GET /met")  # a request that never ends
                except OSError:
                    pass
            socks.append(s)
        except OSError:
            refused += 1
        if i % 50 == 0:
            most = max(most, fds(pid))
    end = time.time() + seconds
    while time.time() < end:
        most = max(most, fds(pid))
        time.sleep(0.1)
    for s in socks:
        s.close()
    # Bounded: the 64 connections the server keeps, and what the process
    # had before.
    ok = most <= before + 64 + 8
    print("PASS metrics/flood_keeps_descriptors_bounded (%d connections; %d fds before, at most "
          "%d during)" % (n, before, most) if ok else
          "FAIL metrics/flood_keeps_descriptors_bounded: %d fds before, %d during" % (before, most))
    try:
        t0 = time.time()
        code, _, text = http_get(port, timeout=10)
        values(text)
        print("PASS metrics/serves_after_flood (%.2f s)" % (time.time() - t0) if code == 200
              else "FAIL metrics/serves_after_flood: code %d" % code)
    except Exception as e:  # noqa: BLE001
        print("FAIL metrics/serves_after_flood: %s" % e)
    return 0


def main():
    cmds = {"freeport": cmd_freeport, "scrape": cmd_scrape, "files": cmd_files,
            "files-final": cmd_files_final, "prometheus": cmd_prometheus, "bad": cmd_bad,
            "flood": cmd_flood}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(__doc__)
        return 2
    sys.stdout.reconfigure(line_buffering=True)
    return cmds[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
