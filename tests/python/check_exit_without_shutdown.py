"""A Horovod script that never calls shutdown() still ends cleanly: the job
exits 0 (run by tests/run-tests.sh at np=2)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hora.torch as hvd  # noqa: E402

hvd.init()
out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="exit")
if hvd.rank() == 0:
    ok = torch.equal(out, torch.full((2,), float(hvd.size())))
    print("%s python/exit_without_shutdown" % ("PASS" if ok else "FAIL"), flush=True)
