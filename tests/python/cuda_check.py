"""hora.torch on CUDA tensors, for scripts/gpu-check.sh (needs a CUDA build
of torch and of libhora; not collected by pytest). Every rank runs every
check; prints "PASS torch-cuda/<check>" or "FAIL torch-cuda/<check>: why"
on rank 0 and exits non-zero on a failure.

    mpirun -np 2 python3 tests/python/cuda_check.py
"""
import os
import sys
import traceback

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hora.torch as hvd  # noqa: E402

failures = 0


def check(name, fn):
    global failures
    try:
        fn()
        ok, why = True, ""
    except Exception as e:  # every rank reports; rank 0 prints
        ok, why = False, "%s: %s" % (type(e).__name__, " ".join(str(e).split())[:300])
        traceback.print_exc()
    every = hvd.allgather_object((ok, why), name="cuda_check.%s" % name)
    if hvd.rank() == 0:
        bad = [(r, w) for r, (o, w) in enumerate(every) if not o]
        if bad:
            print("FAIL torch-cuda/%s: rank(s) %s: %s" % (name, ",".join(str(r) for r, _ in bad),
                                                           bad[0][1]), flush=True)
        else:
            print("PASS torch-cuda/%s" % name, flush=True)
    failures += any(not o for o, _ in every)


def dev():
    return torch.device("cuda", torch.cuda.current_device())


def allreduce_dtypes():
    n = hvd.size()
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
                  torch.int64, torch.uint8, torch.int8, torch.int16, torch.bool):
        x = torch.ones(1000, dtype=dtype, device=dev())
        if dtype == torch.bool:
            out = hvd.allreduce(x, name="ar.%s" % dtype, op=hvd.Max)
            assert out.all().item()
            continue
        out = hvd.allreduce(x, name="ar.%s" % dtype, op=hvd.Sum)
        assert out.is_cuda and out.dtype == dtype
        assert torch.equal(out.cpu(), torch.full((1000,), n, dtype=dtype)), (dtype, out[:4])


def in_place_on_a_busy_stream():
    # Work queued on torch's stream before the call must be in the input.
    n = hvd.size()
    x = torch.zeros(1 << 20, device=dev())
    x.add_(hvd.rank() + 1)  # queued, not yet run
    h = hvd.allreduce_async_(x, name="busy", op=hvd.Sum)
    hvd.synchronize(h)
    want = n * (n + 1) / 2
    assert torch.equal(x, torch.full_like(x, want)), x[:4]
    avg = hvd.allreduce(torch.full((17, 3), float(hvd.rank()), device=dev()), name="avg")
    assert torch.allclose(avg, torch.full((17, 3), (n - 1) / 2, device=dev()))


def broadcast_and_allgather():
    r, n = hvd.rank(), hvd.size()
    b = torch.full((5, 5), float(r), device=dev())
    hvd.broadcast_(b, n - 1, name="bc")
    assert torch.equal(b, torch.full((5, 5), float(n - 1), device=dev()))
    g = hvd.allgather(torch.full((r + 1, 2), r, device=dev(), dtype=torch.int32), name="ag")
    want = torch.cat([torch.full((q + 1, 2), q, dtype=torch.int32) for q in range(n)])
    assert g.is_cuda and torch.equal(g.cpu(), want)


def reducescatter_alltoall_adasum():
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(2 * n + 1, dtype=torch.float32).repeat(3, 1).t().contiguous() + r
    got = hvd.reducescatter(x.to(dev()), name="rs", op=hvd.Sum)
    want = hvd.reducescatter(x, name="rs.cpu", op=hvd.Sum)
    assert got.is_cuda and torch.equal(got.cpu(), want), (got[:2], want[:2])
    splits = torch.tensor([(r + j) % 3 for j in range(n)], dtype=torch.int32)
    t = torch.arange(int(splits.sum()), dtype=torch.float32) + 100 * r
    a, rs = hvd.alltoall(t.to(dev()), splits=splits, name="a2a")
    b, rs_cpu = hvd.alltoall(t, splits=splits, name="a2a.cpu")
    assert a.is_cuda and torch.equal(a.cpu(), b) and torch.equal(rs.cpu(), rs_cpu)
    v = torch.randn(1000, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
    ad = hvd.allreduce(v.to(dev()), name="adasum", op=hvd.Adasum)
    ac = hvd.allreduce(v, name="adasum.cpu", op=hvd.Adasum)
    # CUDA tensors take Horovod's GPU Adasum by default (HORA_HIERARCHICAL_
    # ADASUM=auto): the hosts' sums combined, divided by the ranks per host;
    # on one host, the average. CPU tensors take the flat tree.
    setting = os.environ.get("HORA_HIERARCHICAL_ADASUM", "auto")
    if hvd.local_size() == 1 or setting in ("0", "1"):
        assert ad.is_cuda and torch.equal(ad.cpu(), ac)
    elif hvd.local_size() == n:
        want = hvd.allreduce(v, name="adasum.avg", op=hvd.Average)
        assert ad.is_cuda and torch.allclose(ad.cpu(), want, rtol=1e-12, atol=1e-12)


def optimizer_follows_cpu_reference():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    gpu = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).double().to(dev())
    gpu.load_state_dict(cpu.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(gpu.parameters(), lr=0.1),
                                   named_parameters=gpu.named_parameters())
    ref = torch.optim.SGD(cpu.parameters(), lr=0.1)
    n, r, B = hvd.size(), hvd.rank(), 4
    for step in range(10):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(n * B, 8, generator=g).double(), torch.randn(n * B, 2, generator=g).double()
        opt.zero_grad()
        nn.functional.mse_loss(gpu(x[r * B:(r + 1) * B].to(dev())),
                               y[r * B:(r + 1) * B].to(dev())).backward()
        opt.step()
        ref.zero_grad()
        nn.functional.mse_loss(cpu(x), y).backward()
        ref.step()
    diff = max((p.cpu() - q).abs().max().item() for p, q in zip(gpu.parameters(), cpu.parameters()))
    assert diff < 1e-9, diff


def main():
    hvd.init()
    if not torch.cuda.is_available():
        print("SKIP torch-cuda/all: torch sees no CUDA device", flush=True)
        hvd.shutdown()
        return 0
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    if not hvd.cuda_built():
        print("FAIL torch-cuda/all: this libhora was built without CUDA", flush=True)
        hvd.shutdown()
        return 1
    check("allreduce_every_dtype", allreduce_dtypes)
    check("in_place_on_a_busy_stream", in_place_on_a_busy_stream)
    check("broadcast_and_allgather", broadcast_and_allgather)
    check("reducescatter_alltoall_adasum", reducescatter_alltoall_adasum)
    check("optimizer_follows_cpu_reference", optimizer_follows_cpu_reference)
    hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
