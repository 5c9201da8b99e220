#!/usr/bin/python3
"""Start-up time of PyTorch's gloo backend, the counterpart of hora-bench-startup:
init_process_group("gloo", init_method="env://") and one all_reduce of a
1-element tensor, with torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE) set by whoever starts it; scripts/bench-startup.sh does.

Both clocks are read before `import torch`. Each rank prints

    rank R/N import S init S first_allreduce S from_start S start_realtime T done_realtime T

where import is the seconds `import torch` took, init and first_allreduce
count from the end of that import (so they EXCLUDE it), and from_start is
the first allreduce counted from the top of this script (import included).
A second all_reduce (MAX, not timed) gathers the slowest rank's figures,
and rank 0 prints

    startup np=N excluding_import init_max=S first_allreduce_max=S import_max=S
        from_start_max=S start_realtime_min=T import_end_realtime_max=T
        done_realtime_max=T                                          (one line)

done_realtime_max - import_end_realtime_max is the time from the moment the
last rank had torch imported to the last rank's completion: the rendezvous
without the skew of the imports (which, with many ranks on few cores, spread
over seconds and are otherwise counted as waiting in init).
"""
import time

_start = time.monotonic()
_start_real = time.time()

import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_imported = time.monotonic()
_imported_real = time.time()


def main():
    dist.init_process_group("gloo", init_method="env://")
    t_init = time.monotonic() - _imported
    x = torch.ones(1, dtype=torch.float32)
    dist.all_reduce(x)
    done = time.monotonic()
    done_real = time.time()
    t_first = done - _imported
    rank, size = dist.get_rank(), dist.get_world_size()
    if x.item() != size:
        print(f"bench_startup_gloo: rank {rank}: all_reduce gave {x.item()}, expected {size}",
              file=sys.stderr)
        return 1
    t_import = _imported - _start
    print(f"rank {rank}/{size} import {t_import:.6f} init {t_init:.6f} "
          f"first_allreduce {t_first:.6f} from_start {done - _start:.6f} "
          f"start_realtime {_start_real:.6f} done_realtime {done_real:.6f}", flush=True)
    # The slowest rank's figures; the earliest start goes in negated.
    m = torch.tensor([t_init, t_first, t_import, done - _start, -_start_real, _imported_real,
                      done_real], dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    m = m.tolist()
    if rank == 0:
        print(f"startup np={size} excluding_import init_max={m[0]:.6f} "
              f"first_allreduce_max={m[1]:.6f} import_max={m[2]:.6f} from_start_max={m[3]:.6f} "
              f"start_realtime_min={-m[4]:.6f} import_end_realtime_max={m[5]:.6f} "
              f"done_realtime_max={m[6]:.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
