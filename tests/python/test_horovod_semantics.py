"""Horovod behaviours hora.torch follows to the letter: sparse allreduce,
the zero gradients broadcast_optimizer_state leaves, the gradients of
reducescatter and of the grouped allgather and reducescatter, compression
in grouped reducescatter, and backward_passes_per_step with Adasum."""
import pytest
import torch

import hora.torch as hvd
from test_adasum import tree

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


def sparse_of(r, seed, shape=(17, 6)):
    g = torch.Generator().manual_seed(seed * 100 + r)
    t = torch.rand(shape, generator=g, dtype=torch.float64)
    t[t < 0.7] = 0
    return t.to_sparse()


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name)
def test_sparse_allreduce_async_matches_the_dense_allreduce(op):
    n, r = hvd.size(), hvd.rank()
    handles = [hvd.sparse_allreduce_async(sparse_of(r, k), name="sp.%s.%d" % (op.name, k), op=op)
               for k in range(5)]
    for k, h in enumerate(handles):
        out = h() if k % 2 else hvd.synchronize(h)
        assert out.is_sparse and out.is_coalesced()
        want = sum(sparse_of(q, k).to_dense() for q in range(n))
        if op == hvd.Average:
            want = want / n
        assert torch.allclose(out.to_dense(), want, atol=1e-12), "tensor %d differs" % k
        assert h() is out, "a second call must return the same result"


def test_sparse_allreduce_async_of_an_empty_tensor_and_bad_input():
    h = hvd.sparse_allreduce_async(torch.zeros(4, 3).to_sparse(), name="sp.empty", op=hvd.Sum)
    out = hvd.synchronize(h)
    assert out.shape == (4, 3) and out._nnz() == 0
    with pytest.raises(ValueError, match="sparse"):
        hvd.sparse_allreduce_async(torch.ones(3), name="sp.dense", op=hvd.Sum)


@needs_peers
def test_sparse_allreduce_async_in_a_process_set():
    n, r = hvd.size(), hvd.rank()
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    try:
        if evens.included():
            h = hvd.sparse_allreduce_async(sparse_of(r, 9), name="sp.set", op=hvd.Average,
                                           process_set=evens)
            want = sum(sparse_of(q, 9).to_dense() for q in evens.ranks) / len(evens.ranks)
            assert torch.allclose(h().to_dense(), want, atol=1e-12)
    finally:
        hvd.remove_process_set(evens)


class _WithIndex(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.index = torch.nn.Parameter(torch.tensor([1, 2, 3]), requires_grad=False)


def test_broadcast_optimizer_state_leaves_zero_grads_as_horovod():
    torch.manual_seed(hvd.rank())
    model = _WithIndex()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.count_nonzero(p.grad) == 0, name
            hvd.broadcast(p.grad, 0, name="bos.grad." + name)  # as Horovod's tests do
        else:
            assert p.grad is None, name
    # Horovod makes the state with one step on those zero gradients.
    steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
    assert steps == {1.0}, steps


def test_grouped_allgather_has_the_single_forms_gradient():
    n, r = hvd.size(), hvd.rank()
    xs = [torch.ones(r + 1, 3, dtype=torch.float64, requires_grad=True),
          torch.ones(2, dtype=torch.float64, requires_grad=True)]
    outs = hvd.grouped_allgather(xs, name="gag.grad")
    assert outs[0].shape == (sum(q + 1 for q in range(n)), 3) and outs[1].shape == (2 * n,)
    (sum(o.sum() for o in outs) * (r + 1)).backward()
    single = torch.ones(r + 1, 3, dtype=torch.float64, requires_grad=True)
    (hvd.allgather(single, name="ag.grad.single").sum() * (r + 1)).backward()
    avg = sum(q + 1 for q in range(n)) / n  # the average of the output gradients
    assert torch.allclose(xs[0].grad, torch.full((r + 1, 3), avg, dtype=torch.float64))
    assert torch.allclose(xs[1].grad, torch.full((2,), avg, dtype=torch.float64))
    assert torch.equal(single.grad, xs[0].grad)


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name)
def test_reducescatter_gradient_follows_horovod(op):
    """Horovod's backward: the output gradient times the size for Sum (1 for
    Average), times the scale factors, allgathered."""
    n, r = hvd.size(), hvd.rank()
    pre, post = 2.0, 0.5 if op == hvd.Sum else 3.0
    x = torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True)
    out = hvd.reducescatter(x, name="rs.hgrad.%s" % op.name, op=op, prescale_factor=pre,
                            postscale_factor=post)
    (out * (r + 1)).sum().backward()
    k = (n if op == hvd.Sum else 1) * pre * post
    want = torch.cat([torch.full((2, 3), (q + 1) * k, dtype=torch.float64) for q in range(n)])
    assert torch.allclose(x.grad, want), "gradient %s, Horovod's %s" % (x.grad[:, 0].tolist(),
                                                                      want[:, 0].tolist())
    ys = [torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True),
          torch.ones(n, dtype=torch.float64, requires_grad=True)]
    outs = hvd.grouped_reducescatter(ys, name="grs.hgrad.%s" % op.name, op=op,
                                     prescale_factor=pre, postscale_factor=post)
    (sum(o.sum() for o in outs) * (r + 1)).backward()
    assert torch.allclose(ys[0].grad, want)
    assert torch.allclose(ys[1].grad, torch.tensor([(q + 1) * k for q in range(n)],
                                                   dtype=torch.float64))


def test_grouped_reducescatter_takes_compression_positionally_as_horovod():
    n, r = hvd.size(), hvd.rank()
    xs = [torch.full((2 * n, 4), float(r + 1)), torch.full((n,), 0.5)]
    outs = hvd.grouped_reducescatter(xs, "grs.fp16", hvd.Compression.fp16, hvd.Sum)
    assert [o.dtype for o in outs] == [torch.float32, torch.float32]
    assert torch.equal(outs[0], torch.full((2, 4), float(sum(q + 1 for q in range(n)))))
    assert torch.equal(outs[1], torch.full((1,), 0.5 * n))


def _adasum_model():
    w = torch.nn.Parameter(torch.ones(5, dtype=torch.float64))
    return w


def _vector(r, seed):
    g = torch.Generator().manual_seed(seed * 1000 + r)
    return torch.randn(5, generator=g, dtype=torch.float64) + (0.3 if r % 2 else -0.2)


def test_adasum_optimizer_keeps_backward_passes_per_step():
    n, r = hvd.size(), hvd.rank()
    w = _adasum_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.1), named_parameters=[("w", w)],
                                   op=hvd.Adasum, backward_passes_per_step=2)
    assert opt.backward_passes_per_step == 2
    (w * _vector(r, 3)).sum().backward()
    (w * _vector(r, 4)).sum().backward()  # accumulated locally, then the local step
    opt.step()
    deltas = [-0.1 * (_vector(q, 3) + _vector(q, 4)) for q in range(n)]
    want = torch.ones(5, dtype=torch.float64) + (tree(deltas) if n > 1 else deltas[0])
    assert torch.allclose(w.detach(), want, atol=1e-12), (w, want)
    if n > 1:
        opt.zero_grad()
        for k in range(2):
            (w * _vector(r, 5 + k)).sum().backward()
        with pytest.raises(AssertionError, match="backward_passes_per_step"):
            (w * _vector(r, 7)).sum().backward()
        opt.step()
        opt.set_backward_passes_per_step(1)
        assert opt.backward_passes_per_step == 1
