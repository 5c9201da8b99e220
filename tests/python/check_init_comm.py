"""hora.torch.init with a communicator of the program's (run by
tests/run-tests.sh at np=4 with mpi4py): `split`, init(comm=) on each half of
MPI_COMM_WORLD; `list`, init(comm=[0, 1]) called by ranks 0 and 1 only;
`sets`, init(comm=COMM_WORLD, process_sets=[ProcessSet(subcomm)]).
World rank 0 prints PASS or FAIL python/init_comm_<mode>."""
import os
import sys

import torch
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hora.torch as hvd  # noqa: E402

mode = sys.argv[1]
world = MPI.COMM_WORLD
me, n = world.Get_rank(), world.Get_size()
ok, why = True, ""


def expect(cond, what):
    global ok, why
    if not cond and ok:
        ok, why = False, "rank %d: %s" % (me, what)


if mode == "split":
    half = world.Split(0 if me < n // 2 else 1, me)
    hvd.init(comm=half)
    expect(hvd.size() == half.Get_size() and hvd.rank() == half.Get_rank(),
           "size %d rank %d" % (hvd.size(), hvd.rank()))
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="half")
    expect(out[0].item() == half.Get_size(), "sum %g" % out[0].item())
    hvd.shutdown()
elif mode == "list":
    if me < 2:
        hvd.init(comm=[0, 1])
        expect(hvd.size() == 2 and hvd.rank() == me, "size %d rank %d" % (hvd.size(), hvd.rank()))
        out = hvd.allreduce(torch.full((2,), float(me + 1)), op=hvd.Sum, name="pair")
        expect(out[1].item() == 3.0, "sum %g" % out[1].item())
        hvd.shutdown()
elif mode == "sets":
    sub = world.Split(me % 2, me)
    ps = hvd.ProcessSet(sub)
    hvd.init(comm=world, process_sets=[ps])
    expect(ps.included() and ps.size() == sub.Get_size(), "set of %r" % (ps.size(),))
    out = hvd.allreduce(torch.full((4,), float(me)), op=hvd.Sum, name="parity", process_set=ps)
    want = float(sum(r for r in range(n) if r % 2 == me % 2))
    expect(out[0].item() == want, "sum %g, expected %g" % (out[0].item(), want))
    hvd.shutdown()
results = world.gather((ok, why), root=0)
if me == 0:
    bad = [w for good, w in results if not good]
    print("%s python/init_comm_%s%s" % ("FAIL" if bad else "PASS", mode,
                                       ": " + "; ".join(bad) if bad else ""), flush=True)
