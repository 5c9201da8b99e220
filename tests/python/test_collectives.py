"""hora.torch's collectives against plain torch computations of the same
reductions, for every dtype, op and call form; and the errors they raise."""
import os

import pytest
import torch

import hora.torch as hvd

ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.bool]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


def rank_tensor(r, dtype, shape=(3, 5)):
    """Rank r's input: small values so sums and products stay exact."""
    g = torch.Generator().manual_seed(100 + r)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 4, shape, generator=g).to(dtype)
    v = torch.randint(-3, 4, shape, generator=g)
    return v.to(dtype)


def expected(dtype, op, shape=(3, 5)):
    ins = [rank_tensor(r, dtype, shape) for r in range(hvd.size())]
    if dtype == torch.bool:
        stack = torch.stack(ins)
        if op in (hvd.Sum, hvd.Max):
            return stack.any(0)
        return stack.all(0)
    acc = torch.stack([t.to(torch.float64) for t in ins])
    if op == hvd.Sum:
        out = acc.sum(0)
    elif op == hvd.Average:
        out = acc.sum(0) / hvd.size()
        if not dtype.is_floating_point:
            out = torch.trunc(out)
    elif op == hvd.Min:
        out = acc.min(0).values
    elif op == hvd.Max:
        out = acc.max(0).values
    else:
        out = acc.prod(0)
    return out.to(dtype)


def valid(dtype, op):
    return not (dtype == torch.bool and op == hvd.Average)


# Average of bool is refused (tested below).
@pytest.mark.parametrize("op,dtype", [(o, d) for o in OPS for d in ALL_DTYPES if valid(d, o)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_allreduce_every_dtype_and_op(op, dtype):
    x = rank_tensor(hvd.rank(), dtype)
    before = x.clone()
    want = expected(dtype, op)
    tag = "%s.%s" % (dtype, op.name)
    out = hvd.allreduce(x, name="out." + tag, op=op)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(x, before), "out-of-place allreduce changed its input"
    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 0
    if tol:
        assert torch.allclose(out.double(), want.double(), atol=tol, rtol=tol)
    else:
        assert torch.equal(out, want), (out, want)
    y = x.clone()
    assert hvd.allreduce_(y, name="in." + tag, op=op) is y
    assert torch.equal(y, out)
    h = hvd.allreduce_async(x, name="async." + tag, op=op)
    assert torch.equal(hvd.synchronize(h), out)
    z = x.clone()
    h = hvd.allreduce_async_(z, name="async_." + tag, op=op)
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h) is z and torch.equal(z, out)


def test_allreduce_bool_average_is_refused_and_runtime_stays_usable():
    with pytest.raises(ValueError, match="bool"):
        hvd.allreduce(torch.ones(3, dtype=torch.bool), name="bool.avg", op=hvd.Average)
    assert hvd.allreduce(torch.ones(2), name="after.bool.avg", op=hvd.Sum)[0] == hvd.size()


def test_average_keyword_is_deprecated_but_works():
    x = torch.full((4,), float(hvd.rank()))
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(x, average=False, name="avg.kw")
    assert torch.equal(out, torch.full((4,), float(sum(range(hvd.size())))))
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(x, average=True, op=hvd.Sum, name="avg.kw2")


def test_prescale_and_postscale():
    x = torch.full((6,), 1.0 + hvd.rank(), dtype=torch.float64)
    out = hvd.allreduce(x, name="scaled", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    want = 2.0 * sum(1.0 + r for r in range(hvd.size())) * 0.25
    assert torch.allclose(out, torch.full((6,), want, dtype=torch.float64))


def test_non_contiguous_tensors():
    base = torch.arange(40, dtype=torch.float32).view(5, 8) * (hvd.rank() + 1)
    view = base[:, ::2]
    assert not view.is_contiguous()
    scale = sum(r + 1 for r in range(hvd.size()))
    want = torch.arange(40, dtype=torch.float32).view(5, 8)[:, ::2] * scale
    assert torch.equal(hvd.allreduce(view, name="nc.out", op=hvd.Sum), want)
    hvd.allreduce_(view, name="nc.in", op=hvd.Sum)
    assert torch.equal(base[:, ::2], want)
    assert torch.equal(base[:, 1::2], (torch.arange(40.).view(5, 8) * (hvd.rank() + 1))[:, 1::2])
    t = torch.zeros(3, 4).t()
    if hvd.rank() == 0:
        t.copy_(torch.arange(12.).view(4, 3))
    hvd.broadcast_(t, 0, name="nc.bcast")
    assert torch.equal(t, torch.arange(12.).view(4, 3))


def test_zero_dim_and_empty_tensors():
    s = torch.tensor(float(hvd.rank()))
    assert hvd.allreduce(s, name="scalar", op=hvd.Sum).item() == sum(range(hvd.size()))
    e = torch.empty(0, 3)
    assert hvd.allreduce(e, name="empty").shape == (0, 3)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_allgather_with_different_first_dimensions(dtype):
    r, n = hvd.rank(), hvd.size()
    x = rank_tensor(r, dtype, (r + 1, 2, 3))
    out = hvd.allgather(x, name="ag.%s" % dtype)
    want = torch.cat([rank_tensor(q, dtype, (q + 1, 2, 3)) for q in range(n)])
    assert torch.equal(out, want)
    h = hvd.allgather_async(rank_tensor(r, dtype, (2, 4)), name="ag.eq.%s" % dtype)
    assert torch.equal(hvd.synchronize(h),
                       torch.cat([rank_tensor(q, dtype, (2, 4)) for q in range(n)]))


def test_allgather_interleaved_with_other_waits():
    # A rank may wait on another operation between submitting an allgather
    # and synchronizing it; its second phase must still go out.
    r = hvd.rank()
    h1 = hvd.allgather_async(torch.full((r + 1,), r), name="ag.il")
    h2 = hvd.allreduce_async(torch.ones(3), name="ar.il", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h2), torch.full((3,), float(hvd.size())))
    want = torch.cat([torch.full((q + 1,), q) for q in range(hvd.size())])
    assert torch.equal(hvd.synchronize(h1), want)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_broadcast_every_dtype(dtype):
    n = hvd.size()
    for root in range(n):
        x = rank_tensor(hvd.rank(), dtype, (4, 3))
        want = rank_tensor(root, dtype, (4, 3))
        out = hvd.broadcast(x, root, name="bc.%s.%d" % (dtype, root))
        assert torch.equal(out, want)
        assert torch.equal(x, rank_tensor(hvd.rank(), dtype, (4, 3)))
        hvd.broadcast_(x, root, name="bc_.%s.%d" % (dtype, root))
        assert torch.equal(x, want)
        y = rank_tensor(hvd.rank(), dtype, (4, 3))
        h = hvd.broadcast_async_(y, root, name="bca_.%s.%d" % (dtype, root))
        assert hvd.synchronize(h) is y and torch.equal(y, want)
        h = hvd.broadcast_async(rank_tensor(hvd.rank(), dtype, (4, 3)), root,
                                name="bca.%s.%d" % (dtype, root))
        assert torch.equal(hvd.synchronize(h), want)


def test_names_live_in_one_space_per_kind():
    x = torch.ones(5)
    h1 = hvd.allreduce_async(x, name="shared", op=hvd.Sum)
    h2 = hvd.broadcast_async(x * hvd.rank(), 0, name="shared")
    h3 = hvd.allgather_async(x[:2], name="shared")
    assert torch.equal(hvd.synchronize(h1), torch.full((5,), float(hvd.size())))
    assert torch.equal(hvd.synchronize(h2), torch.zeros(5))
    assert hvd.synchronize(h3).shape == (2 * hvd.size(),)


def test_unnamed_operations_match_in_order():
    hs = [hvd.allreduce_async(torch.full((3,), float(i)), op=hvd.Sum) for i in range(5)]
    for i, h in enumerate(hs):
        assert torch.equal(hvd.synchronize(h), torch.full((3,), float(i * hvd.size())))


@needs_peers
def test_duplicate_name_in_flight_raises_value_error():
    # The name stays in flight on every rank but `late`, which submits it
    # only after the others have tried to submit it twice.
    for late in (0, 1):
        name = "dup.%d" % late
        h = None
        if hvd.rank() != late:
            h = hvd.allreduce_async(torch.ones(4), name=name, op=hvd.Sum)
            with pytest.raises(ValueError, match="already in flight") as e:
                hvd.allreduce_async(torch.ones(4), name=name, op=hvd.Sum)
            assert isinstance(e.value, hvd.HorovodInternalError)  # as Horovod callers catch it
        hvd.allreduce(torch.ones(1), name="dup.go.%d" % late)
        if hvd.rank() == late:
            h = hvd.allreduce_async(torch.ones(4), name=name, op=hvd.Sum)
        assert torch.equal(hvd.synchronize(h), torch.full((4,), float(hvd.size())))
    assert hvd.allreduce(torch.ones(4), name="dup.0", op=hvd.Sum)[0] == hvd.size()


def test_unsupported_tensors_are_refused_before_sending():
    with pytest.raises(ValueError, match="complex"):
        hvd.allreduce(torch.zeros(3, dtype=torch.complex64), name="cplx")
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.eye(3).to_sparse(), name="sparse")
    with pytest.raises(TypeError):
        hvd.allreduce([1.0, 2.0], name="list")
    with pytest.raises(ValueError, match="ADASUM needs a float dtype"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), name="adasum", op=hvd.Adasum)
    with pytest.raises(ValueError, match="root"):
        hvd.broadcast(torch.ones(3), hvd.size() + 3, name="badroot")
    assert hvd.synchronize(123456789) is None  # as Horovod: an unknown handle
    import numpy
    b = hvd.broadcast(torch.full((2,), float(hvd.rank())), numpy.int64(0), name="np.root")
    assert torch.equal(b, torch.zeros(2))
    assert hvd.allreduce(torch.ones(2), name="after.refusals", op=hvd.Sum)[0] == hvd.size()


@needs_peers
def test_dtype_mismatch_fails_on_every_rank():
    dtype = torch.float32 if hvd.rank() == 0 else torch.float64
    with pytest.raises(hvd.HoraInternalError, match="float"):
        hvd.allreduce(torch.ones(4, dtype=dtype), name="mm.dtype")
    assert hvd.allreduce(torch.ones(2), name="after.mm.dtype", op=hvd.Sum)[0] == hvd.size()


@needs_peers
def test_shape_mismatch_with_equal_counts_fails_on_every_rank():
    x = torch.ones(17, 1311) if hvd.rank() == 0 else torch.ones(17, 23, 57)
    with pytest.raises(hvd.HoraInternalError, match="shape") as e:
        hvd.allreduce(x, name="mm.shape")
    assert isinstance(e.value, hvd.HorovodInternalError) and isinstance(e.value, RuntimeError)
    y = torch.ones(3, 4) if hvd.rank() == 0 else torch.ones(3, 5)
    with pytest.raises(hvd.HoraInternalError):
        hvd.allgather(y, name="mm.shape.ag")
    assert hvd.allreduce(torch.ones(2), name="after.mm.shape", op=hvd.Sum)[0] == hvd.size()


@needs_peers
def test_root_mismatch_fails_on_every_rank():
    with pytest.raises(hvd.HoraInternalError, match="root"):
        hvd.broadcast(torch.ones(3), hvd.rank() % 2, name="mm.root")
    assert hvd.allreduce(torch.ones(2), name="after.mm.root", op=hvd.Sum)[0] == hvd.size()


@needs_peers
def test_op_mismatch_fails_on_every_rank():
    op = hvd.Sum if hvd.rank() == 0 else hvd.Max
    with pytest.raises(hvd.HoraInternalError):
        hvd.allreduce(torch.ones(3), name="mm.op", op=op)
    assert hvd.allreduce(torch.ones(2), name="after.mm.op", op=hvd.Sum)[0] == hvd.size()


def test_allreduce_gradient():
    x = torch.full((3,), float(hvd.rank() + 1), requires_grad=True)
    y = hvd.allreduce(x, name="grad.ar", op=hvd.Sum)
    (y * torch.arange(3.)).sum().backward()
    # d/dx_r of sum_i w_i * sum_q x_q is w, summed again over the ranks' gradients.
    assert torch.equal(x.grad, torch.arange(3.) * hvd.size())
    x2 = torch.ones(2, requires_grad=True)
    hvd.allreduce(x2, name="grad.avg").sum().backward()
    assert torch.allclose(x2.grad, torch.ones(2))


def test_allgather_gradient():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((r + 1, 2), 1.0, requires_grad=True)
    y = hvd.allgather(x, name="grad.ag")
    w = torch.arange(float(y.shape[0])).unsqueeze(1).expand(-1, 2)
    (y * w).sum().backward()
    offset = sum(q + 1 for q in range(r))
    # Horovod's rule: the gradient is averaged over ranks (each has this w).
    assert torch.equal(x.grad, w[offset:offset + r + 1])
    assert n == hvd.size()


def test_broadcast_gradient():
    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x, 0, name="grad.bc").sum().backward()
    want = torch.ones(3) if hvd.rank() == 0 else torch.zeros(3)  # averaged at the root
    assert torch.equal(x.grad, want)


def test_join_barrier_and_ranks():
    assert 0 <= hvd.rank() < hvd.size()
    assert 0 <= hvd.local_rank() < hvd.local_size()
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    assert hvd.is_initialized()
    from hora import _lib
    # A libhora built without MPI has no hora_init_comm (hora_mpi.h) either.
    assert hvd.mpi_built() is _lib.load().has_mpi_comm
    assert not hvd.gloo_built() and not hvd.gloo_enabled() and not hvd.rocm_built()
    # Under mpirun, MPI starts the job; under tests/launch/launch.sh
    # (HORA_BOOTSTRAP=tcp or env) or alone, MPI is never started.
    boot = os.environ.get("HORA_BOOTSTRAP", "auto")
    launched = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS")
    by_mpi = boot == "mpi" or (boot == "auto" and any(v in os.environ for v in launched))
    assert hvd.mpi_enabled() is by_mpi
    if by_mpi:
        # hora_init asks MPI for MPI_THREAD_MULTIPLE, which Open MPI and MPICH give.
        assert hvd.mpi_threads_supported() is True
    else:
        with pytest.raises(ValueError, match="MPI is not enabled"):
            hvd.mpi_threads_supported()
    # The stream-ordered calls are exported exactly by builds with CUDA.
    from hora import _lib
    assert hvd.cuda_built() == _lib.load().has_cuda
    assert hvd.nccl_built() in (True, False) and (hvd.cuda_built() or not hvd.nccl_built())
    hvd.barrier()
    # Rank 0 runs out of data first; the others allreduce with its zeros.
    if hvd.rank() != 0:
        out = hvd.allreduce(torch.ones(3), name="join.ar", op=hvd.Sum)
        assert torch.equal(out, torch.full((3,), float(hvd.size() - 1)))
    last = hvd.join()
    assert 0 <= last < hvd.size()
    if hvd.size() > 1:
        assert last != 0


@needs_peers
def test_broadcast_object_while_a_rank_has_joined():
    # Lightning broadcasts objects at the end of an epoch, after some ranks
    # ran out of data: the joined rank takes part, the others get the root's.
    if hvd.rank() != 0:
        got = hvd.broadcast_object({"epoch": 3, "from": hvd.rank()}, root_rank=1,
                                   name="join.obj")
        assert got == {"epoch": 3, "from": 1}
        with pytest.raises(hvd.HoraInternalError, match="its root, rank 0, has called hora_join"):
            hvd.broadcast(torch.ones(2), 0, name="join.from.joined")
    hvd.join()


def test_tensors_on_other_devices_are_refused():
    with pytest.raises(ValueError, match="meta"):
        hvd.allreduce(torch.empty(3, device="meta"), name="meta.dev")


@needs_peers
def test_blocking_calls_release_the_gil():
    import threading
    import time
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)
    t = threading.Thread(target=count)
    t.start()
    try:
        if hvd.rank() == 0:
            time.sleep(0.5)  # the others block in synchronize meanwhile
        before = len(ticks)
        hvd.allreduce(torch.ones(2), name="gil", op=hvd.Sum)
        waited = len(ticks) - before
    finally:
        stop.set()
        t.join()
    if hvd.rank() != 0:
        assert waited > 50, "the counting thread ran %d times in 0.5 s of waiting" % waited


def test_barrier_while_an_allgather_is_between_phases():
    # Rank 0 reaches a barrier before synchronizing its allgather; the
    # others synchronize first. Rank 0's second phase must still go out.
    h = hvd.allgather_async(torch.full((hvd.rank() + 1,), hvd.rank()), name="ag.barrier")
    if hvd.rank() == 0:
        hvd.barrier()
        out = hvd.synchronize(h)
    else:
        out = hvd.synchronize(h)
        hvd.barrier()
    assert torch.equal(out, torch.cat([torch.full((q + 1,), q) for q in range(hvd.size())]))


def test_long_names_are_shortened_the_same_way_on_every_rank():
    name = "x" * 400
    out = hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(hvd.size())))
