"""hora.torch.alltoall and the native allgather under hora.torch.allgather:
every dtype, uneven splits with empty ones, the equal split, received
splits, the gradient, process sets, the output's memory (libhora's buffer,
freed with the tensor) and the errors."""
import gc

import pytest
import torch

import hora.torch as hvd
from test_collectives import ALL_DTYPES

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


def block(src, dst, rows, cols, dtype):
    """What rank src sends rank dst: rows x cols, a function of both."""
    v = torch.arange(rows * cols, dtype=torch.int64).view(rows, cols)
    v = (v + 7 * src + 3 * dst) % 100
    if dtype == torch.bool:
        return (v % 2).bool()
    return v.to(dtype)


def splits_of(src, n):
    return [(src + 2 * j) % 3 for j in range(n)]  # some 0


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_alltoall_uneven_every_dtype(dtype):
    n, r = hvd.size(), hvd.rank()
    cols = 4
    splits = splits_of(r, n)
    x = torch.cat([block(r, j, splits[j], cols, dtype) for j in range(n)])
    before = x.clone()
    out, received = hvd.alltoall(x, splits=splits, name="a2a.%s" % dtype)
    assert torch.equal(x, before), "alltoall changed its input"
    want_splits = [splits_of(j, n)[r] for j in range(n)]
    assert received.dtype == torch.int32 and received.tolist() == want_splits
    want = torch.cat([block(j, r, want_splits[j], cols, dtype) for j in range(n)])
    assert out.dtype == dtype and out.shape == want.shape
    assert torch.equal(out, want)
    h = hvd.alltoall_async(x, splits=torch.tensor(splits), name="a2a.async.%s" % dtype)
    out2, received2 = hvd.synchronize(h)
    assert torch.equal(out2, want) and torch.equal(received2, received)


def test_alltoall_equal_split_returns_only_the_output():
    n, r = hvd.size(), hvd.rank()
    x = torch.cat([block(r, j, 2, 3, torch.float32) for j in range(n)])
    out = hvd.alltoall(x, name="a2a.equal")
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, torch.cat([block(j, r, 2, 3, torch.float32) for j in range(n)]))


def test_alltoall_gradient_goes_back_where_it_came_from():
    n, r = hvd.size(), hvd.rank()
    splits = [1 + (r + j) % 2 for j in range(n)]
    x = torch.arange(sum(splits) * 2, dtype=torch.float64).view(-1, 2).requires_grad_()
    out, received = hvd.alltoall(x, splits=splits, name="a2a.grad")
    # Weight each received row by the rank it came from: the gradient of
    # the rows this rank sent to rank j is then j + 1.
    weights = torch.cat([torch.full((int(k), 2), float(j + 1), dtype=torch.float64)
                         for j, k in enumerate(received.tolist())])
    (out * weights).sum().backward()
    want = torch.cat([torch.full((splits[j], 2), float(r + 1), dtype=torch.float64)
                      for j in range(n)])
    assert torch.equal(x.grad, want), (x.grad, want)


def test_alltoall_output_memory_is_freed_with_the_tensor():
    n = hvd.size()
    x = torch.ones(n * 1000, 64)
    for i in range(30):
        out = hvd.alltoall(x, name="a2a.memory")
        view = out[1:5]
        del out
        assert torch.equal(view, torch.ones(4, 64))  # the buffer lives while a view does
        del view
    gc.collect()


def test_alltoall_rows_without_elements_and_empty_tensors():
    n = hvd.size()
    out, received = hvd.alltoall(torch.empty(n, 0), splits=[1] * n, name="a2a.no.cols")
    assert out.shape == (n, 0) and received.tolist() == [1] * n
    out, received = hvd.alltoall(torch.empty(0, 3), splits=[0] * n, name="a2a.none")
    assert out.shape == (0, 3) and received.tolist() == [0] * n


def test_alltoall_errors():
    n = hvd.size()
    with pytest.raises(ValueError, match="splits has"):
        hvd.alltoall(torch.ones(n, 2), splits=[1] * (n + 1), name="a2a.bad")
    with pytest.raises(ValueError, match="add up to"):
        hvd.alltoall(torch.ones(n, 2), splits=[1] * (n - 1) + [2], name="a2a.bad")
    with pytest.raises(ValueError, match="negative"):
        hvd.alltoall(torch.ones(n, 2), splits=[-1] + [1] * (n - 1), name="a2a.bad")
    with pytest.raises(ValueError, match="0-dimensional"):
        hvd.alltoall(torch.tensor(1.0), name="a2a.bad")
    if n > 1:
        with pytest.raises(ValueError, match="does not split equally"):
            hvd.alltoall(torch.ones(n + 1, 2), name="a2a.bad")


@needs_peers
def test_alltoall_trailing_dimensions_must_agree():
    r = hvd.size()
    cols = 3 if hvd.rank() == 0 else 2
    with pytest.raises(hvd.HoraInternalError, match="shape"):
        hvd.alltoall(torch.ones(r, cols), name="a2a.shape")


@pytest.mark.skipif("hvd.size() < 3", reason="needs 3 ranks")
def test_alltoall_within_a_process_set():
    ps = hvd.add_process_set([0, 2])
    try:
        if ps.included():
            me = ps.rank()
            x = torch.tensor([[10.0 * me], [10.0 * me + 1]])
            out = hvd.alltoall(x, name="a2a.set", process_set=ps)
            assert out.view(-1).tolist() == [0.0 + me, 10.0 + me]
    finally:
        hvd.remove_process_set(ps)


def test_allgather_of_different_first_dimensions_is_one_native_operation():
    n, r = hvd.size(), hvd.rank()
    x = torch.full((r % 3, 2), float(r))  # rank 0 sends no rows
    out = hvd.allgather(x, name="ag.native")
    want = torch.cat([torch.full((q % 3, 2), float(q)) for q in range(n)])
    assert torch.equal(out, want)
    out = hvd.synchronize(hvd.allgather_async(torch.full((2,), float(r)), name="ag.native.1d"))
    assert out.tolist() == sum([[float(q)] * 2 for q in range(n)], [])
