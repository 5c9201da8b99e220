"""Ranks that submit different names: with HORA_STALL_SHUTDOWN_TIME_SECONDS
set, every rank's synchronize raises HoraInternalError naming the stalled
operation and the ranks missing from it, within seconds (run by
tests/run-tests.sh at np=2; prints one PASS or FAIL line on each rank, which
the runner folds into one)."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hora.torch as hvd  # noqa: E402

hvd.init()
r = hvd.rank()
start = time.time()
try:
    hvd.allreduce(torch.ones(4), name="grad.rank%d" % r)
    print("FAIL np=%d python/name_mismatch_fails_every_rank: rank %d's allreduce succeeded"
          % (hvd.size(), r))
except hvd.HorovodInternalError as e:
    msg = str(e)
    other = "grad.rank%d" % (1 - r)
    took = time.time() - start
    if "allreduce.grad.rank" in msg and "stalled" in msg and "waiting for rank(s)" in msg \
            and took < 30:
        print("PASS np=%d python/name_mismatch_fails_every_rank (rank %d, %.1f s: %s)"
              % (hvd.size(), r, took, " ".join(msg.split())[:200]))
    else:
        print("FAIL np=%d python/name_mismatch_fails_every_rank: rank %d after %.1f s: %s (%s)"
              % (hvd.size(), r, took, msg, other))
sys.stdout.flush()
hvd.shutdown()
