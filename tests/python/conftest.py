"""Runs the hora.torch tests under mpirun (or tests/launch/launch.sh, which
starts them without MPI): every rank runs every test, in the same order.
At the end rank 0 prints one line per test for the suite's runner,
"PASS python/<test>" or "FAIL python/<test>: <ranks and reason>", from
every rank's outcomes (gathered through hora itself)."""
import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

try:
    import torch  # noqa: E402
except ImportError:  # the runner checks for torch before starting pytest
    torch = None

_outcomes = {}  # nodeid -> (outcome, short reason)


def pytest_configure(config):
    if torch is None:
        return
    import hora.torch as hvd
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    hvd.init()
    _claim_rank(hvd.rank(), hvd.size())


def _claim_rank(rank, size):
    """Under tests/launch/launch.sh: two processes that hora gave one rank (a
    world that is not the processes started) fail, not pass twice over."""
    top = os.environ.get("HORA_TEST_DIR")
    if not top:
        return
    try:
        os.close(os.open(os.path.join(top, "rank.%d" % rank), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o600))
    except FileExistsError:
        sys.stderr.write("rank %d: another process of this job is rank %d too (hora's world has %d "
                         "ranks: not the processes the launcher started?)\n" % (rank, rank, size))
        sys.stderr.flush()
        os._exit(2)


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        reason = ""
        if report.outcome == "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = (crash.message if crash else str(report.longrepr)).strip()
            reason = " ".join(reason.split())[:300]
        elif report.outcome == "skipped":
            reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple)
                         else report.longrepr)[:300]
        _outcomes[report.nodeid] = (report.outcome, reason)


def pytest_collectreport(report):
    if report.failed:  # a file that cannot be imported is a failure, not a silence
        crash = getattr(report.longrepr, "reprcrash", None)
        why = crash.message if crash else str(report.longrepr).strip().splitlines()[-1]
        _outcomes[report.nodeid or "collection"] = ("failed", " ".join(why.split())[:300])


def _line(nodeid, per_rank):
    name = "python/" + nodeid.replace("tests/python/", "").replace(".py::", "::")
    failed = [(r, o[1]) for r, o in enumerate(per_rank) if o is None or o[0] == "failed"]
    if failed:
        ranks = ",".join(str(r) for r, _ in failed)
        reason = next((why for _, why in failed if why), "no result")
        return "FAIL %s: rank(s) %s: %s" % (name, ranks, reason)
    if all(o[0] == "skipped" for o in per_rank):
        return "SKIP %s: %s" % (name, per_rank[0][1])
    return "PASS %s" % name


def pytest_sessionfinish(session, exitstatus):
    if torch is None:
        return
    import hora.torch as hvd
    try:
        everyone = hvd.allgather_object(_outcomes, name="tests.outcomes")
    except Exception as e:  # the runtime is gone: each rank reports its own
        sys.stdout.write("# outcomes not gathered (%s); rank %d's own:\n" % (e, hvd.rank()))
        everyone = None
    lines = []
    if everyone is None:
        for nodeid, o in _outcomes.items():
            lines.append(_line(nodeid, [o]))
    elif hvd.rank() == 0:
        ids = list(dict.fromkeys(k for d in everyone for k in d))
        for nodeid in ids:
            lines.append(_line(nodeid, [d.get(nodeid) for d in everyone]))
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
    hvd.shutdown()
