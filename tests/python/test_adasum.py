"""op=hvd.Adasum: allreduce against a reference tree of pairwise Adasum
combinations written here in torch (double), and DistributedOptimizer(op=
Adasum), whose ranks' parameter updates combine by Adasum."""
import torch

import hora.torch as hvd


def pair(a, b):
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def tree(vs):
    vs = [v.double().clone() for v in vs]
    n, P = len(vs), 1
    while P * 2 <= n:
        P *= 2
    for q in range(n - P):
        vs[q] = pair(vs[q], vs[q + P])
    step = 1
    while step < P:
        for left in range(0, P, 2 * step):
            vs[left] = pair(vs[left], vs[left + step])
        step *= 2
    return vs[0]


def vector(r, n, seed):
    g = torch.Generator().manual_seed(seed * 1000 + r)
    return torch.randn(n, generator=g, dtype=torch.float64) + (0.3 if r % 2 else -0.2)


def test_adasum_allreduce_matches_the_reference_tree():
    n, r = hvd.size(), hvd.rank()
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5), (torch.float16, 2e-2)):
        x = vector(r, 257, 1).to(dtype).view(257)
        want = tree([vector(q, 257, 1).to(dtype) for q in range(n)])
        out = hvd.allreduce(x, name="adasum.%s" % dtype, op=hvd.Adasum)
        assert out.dtype == dtype
        err = (out.double() - want).abs().max() / want.abs().max()
        assert err < tol, (dtype, float(err))


def test_adasum_optimizer_combines_the_updates():
    n, r = hvd.size(), hvd.rank()
    w = torch.nn.Parameter(torch.ones(5, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.1), named_parameters=[("w", w)],
                                   op=hvd.Adasum)
    loss = (w * vector(r, 5, 2)).sum()  # its gradient is the vector
    loss.backward()
    opt.step()
    deltas = [-0.1 * vector(q, 5, 2) for q in range(n)]
    want = torch.ones(5, dtype=torch.float64) + tree(deltas)
    assert torch.allclose(w.detach(), want, atol=1e-12), (w, want)
