"""hora.torch.reducescatter against torch's own reduction of every rank's
input, split by rows as Horovod splits them (the first rows % size ranks one
row more): every dtype and op, uneven rows, scales, process sets, the
gradient, and the errors."""
import pytest
import torch

import hora.torch as hvd
from test_collectives import ALL_DTYPES, OPS, expected, rank_tensor, valid

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


def share(rows, n, r):
    """(first row, rows) of rank r's share."""
    base, rem = divmod(rows, n)
    return r * base + min(r, rem), base + (1 if r < rem else 0)


@pytest.mark.parametrize("op,dtype", [(o, d) for o in OPS for d in ALL_DTYPES if valid(d, o)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_reducescatter_every_dtype_and_op(op, dtype):
    rows = hvd.size() + 2  # uneven: the first two ranks get a row more
    shape = (rows, 5)
    x = rank_tensor(hvd.rank(), dtype, shape)
    before = x.clone()
    want_all = expected(dtype, op, shape)
    first, mine = share(rows, hvd.size(), hvd.rank())
    out = hvd.reducescatter(x, name="rs.%s.%s" % (dtype, op.name), op=op)
    assert torch.equal(x, before), "reducescatter changed its input"
    assert out.dtype == dtype and out.shape == (mine, 5)
    want = want_all.narrow(0, first, mine)
    if dtype in (torch.float16, torch.bfloat16):
        assert torch.allclose(out.double(), want.double(), atol=1e-2, rtol=1e-2)
    else:
        assert torch.equal(out, want), (out, want)
    h = hvd.reducescatter_async(x, name="rs.async.%s.%s" % (dtype, op.name), op=op)
    assert torch.equal(hvd.synchronize(h), out)


def test_reducescatter_default_is_average_with_scales():
    n, r = hvd.size(), hvd.rank()
    x = torch.full((2 * n + 1, 3), float(r + 1), dtype=torch.float64)
    out = hvd.reducescatter(x, name="rs.avg", prescale_factor=3.0, postscale_factor=0.5)
    want = 3.0 * sum(q + 1 for q in range(n)) / n * 0.5
    assert out.shape[0] == share(2 * n + 1, n, r)[1]
    assert torch.allclose(out, torch.full_like(out, want))


def test_reducescatter_of_rows_without_elements():
    out = hvd.reducescatter(torch.empty(hvd.size() + 1, 0), name="rs.no.cols", op=hvd.Sum)
    assert out.shape == (2 if hvd.rank() == 0 else 1, 0)


def test_reducescatter_fewer_rows_than_ranks():
    n, r = hvd.size(), hvd.rank()
    out = hvd.reducescatter(torch.ones(1, 4), name="rs.one.row", op=hvd.Sum)
    assert out.shape == ((1 if r == 0 else 0), 4)
    if r == 0:
        assert torch.equal(out, torch.full((1, 4), float(n)))


@needs_peers
def test_reducescatter_within_a_process_set():
    n = hvd.size()
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    try:
        if evens.included():
            m, me = evens.size(), evens.rank()
            x = torch.full((m + 1, 2), float(hvd.rank()))
            out = hvd.reducescatter(x, name="rs.set", op=hvd.Sum, process_set=evens)
            assert out.shape[0] == share(m + 1, m, me)[1]
            assert torch.equal(out, torch.full_like(out, float(sum(evens.ranks))))
    finally:
        hvd.remove_process_set(evens)


def test_reducescatter_gradient_is_the_gathered_output_gradient():
    n = hvd.size()
    x = torch.full((2 * n, 3), 1.0, requires_grad=True)
    out = hvd.reducescatter(x, name="rs.grad", op=hvd.Average)
    (out * (hvd.rank() + 1)).sum().backward()
    # Horovod's convention: for Average the output gradients gathered as
    # they are (size times the plain derivative, which divides by n).
    want = torch.cat([torch.full((2, 3), float(q + 1)) for q in range(n)])
    assert torch.allclose(x.grad, want)


def test_reducescatter_errors():
    with pytest.raises(ValueError, match="0-dimensional"):
        hvd.reducescatter(torch.tensor(1.0), name="rs.scalar")
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.reducescatter(torch.ones(2), name="rs.adasum", op=hvd.Adasum)
    assert hvd.reducescatter(torch.ones(hvd.size()), name="rs.after", op=hvd.Sum)[0] == hvd.size()
