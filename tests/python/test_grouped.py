"""hora.torch's grouped collectives: grouped_allreduce (out of place, in
place, async, with its gradient), grouped_allgather and
grouped_reducescatter against the single operations, and a mismatched
member failing the whole group on every rank."""
import pytest
import torch

import hora.torch as hvd

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


def tensors(r):
    return [torch.full((3,), float(r + 1)), torch.arange(10, dtype=torch.float64) * r,
            torch.ones(2, 2, dtype=torch.int32) * (r + 2)]


def test_grouped_allreduce_matches_single_allreduces():
    n, r = hvd.size(), hvd.rank()
    got = hvd.grouped_allreduce(tensors(r), name="g.ar", op=hvd.Sum)
    want = [hvd.allreduce(t, name="g.ar.single.%d" % i, op=hvd.Sum)
            for i, t in enumerate(tensors(r))]
    assert len(got) == 3
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)
    avg = hvd.synchronize(hvd.grouped_allreduce_async(tensors(r)[:2], name="g.ar.avg"))
    assert torch.allclose(avg[0], torch.full((3,), (n + 1) / 2))


def test_grouped_allreduce_in_place():
    n, r = hvd.size(), hvd.rank()
    ts = tensors(r)
    out = hvd.grouped_allreduce_(ts, name="g.ar.inplace", op=hvd.Sum)
    assert all(o is t for o, t in zip(out, ts))
    assert torch.equal(ts[0], torch.full((3,), float(n * (n + 1) // 2)))


def test_grouped_allreduce_gradient():
    n = hvd.size()
    a = torch.ones(4, requires_grad=True)
    b = torch.ones(2, 3, requires_grad=True)
    x, y = hvd.grouped_allreduce([a, b], name="g.ar.grad", op=hvd.Sum)
    (x.sum() * 2 + y.sum()).backward()
    assert torch.equal(a.grad, torch.full((4,), 2.0 * n))
    assert torch.equal(b.grad, torch.full((2, 3), float(n)))


def test_grouped_allgather_and_reducescatter():
    n, r = hvd.size(), hvd.rank()
    parts = [torch.full((r + 1, 2), float(r)), torch.full((1,), float(r))]
    got = hvd.grouped_allgather(parts, name="g.ag")
    assert torch.equal(got[0], torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)]))
    assert got[1].tolist() == [float(q) for q in range(n)]
    rs = hvd.grouped_reducescatter([torch.ones(n * 2, 3), torch.ones(n)], name="g.rs",
                                   op=hvd.Sum)
    assert torch.equal(rs[0], torch.full((2, 3), float(n)))
    assert torch.equal(rs[1], torch.full((1,), float(n)))


@needs_peers
def test_a_mismatched_member_fails_the_group_on_every_rank():
    r = hvd.rank()
    bad = torch.ones(3 if r == 0 else 4)
    with pytest.raises(hvd.HoraInternalError) as e:
        hvd.grouped_allreduce([torch.ones(2), bad], name="g.bad", op=hvd.Sum)
    assert "group" in str(e.value) or "elements" in str(e.value)
    # The same names, grouped right, work afterwards.
    out = hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], name="g.bad", op=hvd.Sum)
    assert torch.equal(out[1], torch.full((3,), float(hvd.size())))


def test_grouped_errors():
    with pytest.raises(ValueError, match="non-empty list"):
        hvd.grouped_allreduce([], name="g.none")
