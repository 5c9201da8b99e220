#!/usr/bin/python3
"""Training steps with hora.torch.DistributedOptimizer against PyTorch's own
DistributedDataParallel on the gloo backend, in one run, on the same model
(torchvision's ResNet-18: 11.7M parameters in 62 tensors) and batch.

    mpirun -np 2 /usr/bin/python3 examples/pytorch/bench_ddp.py
    mpirun -np 4 /usr/bin/python3 examples/pytorch/bench_ddp.py

Rounds alternate the two so both see the same machine; medians are quoted.
Also measured: the step without any communication (how much of DDP's step is
communication), the gradient set's allreduce alone (hora against
torch.distributed.all_reduce on gloo), and the binding's own cost per call.
"""
import argparse
import ctypes
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hora.torch as hvd  # noqa: E402
from hora import _lib as L  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=2, help="per rank")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--calls", type=int, default=2000, help="calls for the per-call cost")
    return p.parse_args()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def model_and_data(args):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000)
    g = torch.Generator().manual_seed(1 + hvd.rank())
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
    y = torch.randint(0, 1000, (args.batch_size,), generator=g)
    return model, x, y


def time_steps(step, n):
    step()  # warm-up
    hvd.barrier()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(n):
        step()
    per = (time.perf_counter() - t) / n
    # The slowest rank's time is the job's.
    return hvd.allreduce(torch.tensor(per, dtype=torch.float64), op=hvd.Max,
                         name="bench.time").item()


def binding_cost(calls):
    """Seconds per allreduce of one float through hora.torch (submit and
    synchronize), and through bare ctypes calls with prepared arguments."""
    lib = L.load()
    ts = [torch.zeros(1) for _ in range(calls)]
    names = ["cost.%d" % i for i in range(calls)]
    hvd.barrier()
    t = time.perf_counter()
    hs = [hvd.allreduce_async_(ts[i], name=names[i], op=hvd.Sum) for i in range(calls)]
    submit = time.perf_counter() - t
    hvd.synchronize(hs[-1])
    t = time.perf_counter()
    for h in hs[:-1]:
        hvd.synchronize(h)
    sync = time.perf_counter() - t
    # The same calls with everything prepared: what is left is libhora and ctypes.
    opts = L.AllreduceOptions(ctypes.sizeof(L.AllreduceOptions), 1.0, 1.0, -1, -1, None)
    keys = [("allreduce.raw.%d" % i).encode() for i in range(calls)]
    reqs = [ctypes.c_void_p() for _ in range(calls)]
    ptrs = [x.data_ptr() for x in ts]
    f, w, byref = lib.hora_allreduce_async_ex, lib.hora_wait, ctypes.byref
    hvd.barrier()
    t = time.perf_counter()
    for i in range(calls):
        f(keys[i], ptrs[i], ptrs[i], 1, L.FLOAT32, L.SUM, byref(opts), byref(reqs[i]))
    raw_submit = time.perf_counter() - t
    w(byref(reqs[-1]))
    t = time.perf_counter()
    for r in reqs[:-1]:
        w(byref(r))
    raw_sync = time.perf_counter() - t
    per = (submit + sync) / calls
    raw = (raw_submit + raw_sync) / calls
    return per, raw


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, 0, name="port")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=hvd.rank(), world_size=hvd.size())

    model, x, y = model_and_data(args)
    params = sum(p.numel() for p in model.parameters())
    tensors = sum(1 for _ in model.parameters())

    # hora: DistributedOptimizer over a plain model.
    hora_model = model
    hora_opt = hvd.DistributedOptimizer(torch.optim.SGD(hora_model.parameters(), lr=0.01),
                                        named_parameters=hora_model.named_parameters())

    def hora_step():
        hora_opt.zero_grad()
        F.cross_entropy(hora_model(x), y).backward()
        hora_opt.step()

    # DDP on gloo over its own copy.
    ddp_model = torch.nn.parallel.DistributedDataParallel(model_and_data(args)[0])
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

    def ddp_step():
        ddp_opt.zero_grad()
        F.cross_entropy(ddp_model(x), y).backward()
        ddp_opt.step()

    # The same work without communication.
    local_model = model_and_data(args)[0]
    local_opt = torch.optim.SGD(local_model.parameters(), lr=0.01)

    def local_step():
        local_opt.zero_grad()
        F.cross_entropy(local_model(x), y).backward()
        local_opt.step()

    # Communication alone: the gradient set, every tensor at once.
    grads = [torch.randn(p.shape) for p in model.parameters()]
    names = ["grad.%d" % i for i in range(len(grads))]

    def hora_comm():
        hs = [hvd.allreduce_async_(g, name=n, op=hvd.Sum) for g, n in zip(grads, names)]
        for h in hs:
            hvd.synchronize(h)

    def gloo_comm():
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()

    res = {k: [] for k in ("hora", "ddp", "local", "hora_comm", "gloo_comm")}
    for rnd in range(args.rounds):
        res["hora"].append(time_steps(hora_step, args.steps))
        res["ddp"].append(time_steps(ddp_step, args.steps))
        res["local"].append(time_steps(local_step, args.steps))
        res["hora_comm"].append(time_steps(hora_comm, args.steps))
        res["gloo_comm"].append(time_steps(gloo_comm, args.steps))
    per, raw = binding_cost(args.calls)
    per = hvd.allreduce(torch.tensor(per, dtype=torch.float64), name="bench.per").item()
    raw = hvd.allreduce(torch.tensor(raw, dtype=torch.float64), name="bench.raw").item()

    if hvd.rank() == 0:
        med = {k: statistics.median(v) for k, v in res.items()}
        print("bench_ddp: %d ranks, ResNet-18 (%d parameters in %d tensors), batch %d of "
              "%dx%d images per rank, %d rounds x %d steps, medians"
              % (hvd.size(), params, tensors, args.batch_size, args.image_size, args.image_size,
                 args.rounds, args.steps))
        print("  step, hora DistributedOptimizer: %8.1f ms" % (med["hora"] * 1e3))
        print("  step, DDP on gloo:               %8.1f ms   hora/DDP = %.2f"
              % (med["ddp"] * 1e3, med["hora"] / med["ddp"]))
        print("  step without communication:      %8.1f ms   (communication is %.0f%% of "
              "DDP's step)" % (med["local"] * 1e3,
                               100 * max(0.0, 1 - med["local"] / med["ddp"])))
        print("  gradient allreduce, hora:        %8.1f ms" % (med["hora_comm"] * 1e3))
        print("  gradient allreduce, gloo:        %8.1f ms   hora/gloo = %.2f"
              % (med["gloo_comm"] * 1e3, med["hora_comm"] / med["gloo_comm"]))
        print("  per allreduce call, hora.torch:  %8.2f us   (bare ctypes calls into libhora: "
              "%.2f us; the binding's own cost: %.2f us)" % (per * 1e6, raw * 1e6,
                                                            (per - raw) * 1e6))
        print("  rounds (ms): " + "; ".join(
            "%s %s" % (k, " ".join("%.0f" % (v * 1e3) for v in vals)) for k, vals in res.items()))
        sys.stdout.flush()
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
