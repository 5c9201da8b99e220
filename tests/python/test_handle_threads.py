"""Handles used from several threads at once: threads spinning on poll()
while the main thread synchronizes the same handles. Each handle's request
must be tested or waited (and freed by libhora) exactly once at a time, and
a staged allgather's second phase submitted exactly once, whichever thread
sees its first phase complete."""
import sys
import threading
import time

import pytest
import torch

import hora.torch as hvd
from hora.torch import mpi_ops as M

ROUNDS = 60
POLLERS = 3


def staged_allgather(tensor, name):
    """The two-phase allgather that allgather_async runs for CUDA tensors
    (_Allgather), here on a CPU tensor: its phase two takes the CPU call."""
    ps = hvd.global_process_set
    key = M._op_name("allgather", name, ps)
    h = M._Allgather(tensor, key, ps)
    i = M._submitted(h.submit_sizes(), h, "allgather '%s'" % key)
    M._staged[i] = h
    return i


def submit_round(k):
    """[(handle, what, expected result)] of round k; the same on every rank."""
    r, n = hvd.rank(), hvd.size()
    out = []
    for j in range(2):
        t = torch.full((17,), float(r + 1 + j))
        out.append((hvd.allreduce_async(t, op=hvd.Sum, name="thr.ar.%d.%d" % (k, j)),
                    "allreduce", torch.full((17,), float(n * (n + 1) // 2 + n * j))))
    b = torch.full((5,), float(r * 10 + k))
    out.append((hvd.broadcast_async(b, 0, name="thr.bc.%d" % k), "broadcast",
                torch.full((5,), float(k))))
    rows = [q % 3 + 1 for q in range(n)]  # ranks differ in the first dimension
    want = torch.cat([torch.full((rows[q], 2), float(q)) for q in range(n)])
    out.append((staged_allgather(torch.full((rows[r], 2), float(r)), "thr.sag.%d" % k),
                "staged allgather", want))
    out.append((staged_allgather(torch.full((2, 3), float(r)), "thr.sag2.%d" % k),
                "staged allgather (equal rows)",
                torch.cat([torch.full((2, 3), float(q)) for q in range(n)])))
    out.append((hvd.allgather_async(torch.full((rows[r], 2), float(r)), name="thr.ag.%d" % k),
                "allgather", want))
    g = hvd.grouped_allreduce_async([torch.full((3,), float(r)), torch.full((4,), 1.0)],
                                    op=hvd.Sum, name="thr.gr.%d" % k)
    out.append((g, "grouped allreduce",
                [torch.full((3,), float(n * (n - 1) // 2)), torch.full((4,), float(n))]))
    return out


def same(got, want):
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            same(a, b) for a, b in zip(got, want))
    return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want)


def test_poll_on_threads_while_synchronizing():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the threads' Python steps finely
    problems = []
    try:
        for k in range(ROUNDS):
            ops = submit_round(k)
            handles = [h for h, _, _ in ops]
            stop = threading.Event()
            start = threading.Barrier(POLLERS + 1)

            def poller(order):
                start.wait()
                live = list(handles[::order])
                while live and not stop.is_set():
                    for h in list(live):
                        try:
                            if hvd.poll(h):
                                live.remove(h)
                        except ValueError:  # synchronized already: no longer a handle
                            live.remove(h)
                        except Exception as e:
                            problems.append("round %d: poll raised %r" % (k, e))
                            live.remove(h)

            threads = [threading.Thread(target=poller, args=(1 if p % 2 else -1,), daemon=True)
                       for p in range(POLLERS)]
            for t in threads:
                t.start()
            start.wait()
            for h, what, want in ops:
                try:
                    got = hvd.synchronize(h)
                except Exception as e:
                    problems.append("round %d: synchronize of %s raised %r" % (k, what, e))
                    continue
                if not same(got, want):
                    problems.append("round %d: %s gave %s, expected %s" % (k, what, got, want))
            stop.set()
            for t in threads:
                t.join(30)
                if t.is_alive():
                    problems.append("round %d: a polling thread did not finish" % k)
            if problems:
                break
        # Nothing left staged or registered from these rounds.
        if M._staged:
            problems.append("allgathers still staged: %s" % sorted(M._staged))
    finally:
        sys.setswitchinterval(old)
    if problems:
        pytest.fail("; ".join(problems[:5]), pytrace=False)


def test_concurrent_advance_submits_phase_two_once(monkeypatch):
    """Several threads advancing one staged allgather at once (as concurrent
    poll() calls do) must submit its second phase once: a second submission
    replaces the request and buffers libhora is still using."""
    r, n = hvd.rank(), hvd.size()
    submitted = []
    real = M._lib.hora_allgather_async_ex

    def counting(name, *args):
        submitted.append(name)  # (list.append is atomic)
        return real(name, *args)
    monkeypatch.setattr(M._lib, "hora_allgather_async_ex", counting)
    for k in range(ROUNDS):
        i = staged_allgather(torch.full((r + 1, 2), float(r)), "thr.adv.%d" % k)
        h = M._handles[i]
        go = threading.Barrier(4)
        errs = []

        def adv():
            go.wait()
            try:
                while not h.advance():  # True once its second phase is out
                    time.sleep(0)
            except Exception as e:
                errs.append(repr(e))
        ts = [threading.Thread(target=adv, daemon=True) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        M._staged.pop(i, None)
        try:
            got = hvd.synchronize(i)
        except Exception as e:
            pytest.fail("round %d: synchronize raised %r (advance: %s)" % (k, e, errs),
                        pytrace=False)
        want = torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)])
        key = M._op_name("allgather", "thr.adv.%d" % k, hvd.global_process_set).encode()
        twos = submitted.count(key)
        if errs or twos != 1 or not torch.equal(got, want):
            pytest.fail("round %d: advance raised %s; phase two submitted %d times; result %s, "
                        "expected %s" % (k, errs, twos, got, want), pytrace=False)
