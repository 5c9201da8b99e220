"""Pre- and postscale factors and Average, element for element as Horovod
computes them on the CPU: each factor (Average: the postscale divided by the
set's size, in double) multiplies every element once; an integer element is
scaled in float64 and cast back (toward zero) on each rank before the sum
(prescale) or after it (postscale); float16 and bfloat16 are scaled in
float32, float32 by the factor rounded to float32, float64 in double."""
import pytest
import torch

import hora.torch as hvd

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FACTORS = [(1.0, 1.0), (0.3, 1.0), (1.0, 0.3), (1.7, 0.45), (2.5, 1.0 / 3)]


def horovod_scale(t, factor):
    """What Horovod's ScaleBuffer does to a CPU tensor (its dtype kept)."""
    if factor == 1.0:
        return t.clone()
    if not t.dtype.is_floating_point:
        return (t.to(torch.float64) * factor).to(t.dtype)  # the cast truncates
    if t.dtype == torch.float64:
        return t * factor
    f32 = torch.tensor(factor, dtype=torch.float32)
    return (t.to(torch.float32) * f32).to(t.dtype)


def same(out, want, what):
    if not torch.equal(out, want):
        bad = (out != want).nonzero().flatten().tolist()[:5]
        pytest.fail("%s: elements %s are %s, Horovod's are %s" % (
            what, bad, out[bad].tolist(), want[bad].tolist()))


def inputs(dtype, r, n=64):
    """Rank r's input; only rank 0 holds nonzero floats, so the sum is the
    same in any order of reduction."""
    g = torch.Generator().manual_seed(7 + r)
    if dtype.is_floating_point:
        if r:
            return torch.zeros(n, dtype=dtype)
        return (torch.rand(n, generator=g, dtype=torch.float64) * 40 - 20).to(dtype)
    lo = 0 if dtype == torch.uint8 else -20
    return torch.randint(lo, 21, (n,), generator=g).to(dtype)


def reference(dtype, op, pre, post, ranks):
    scaled = [horovod_scale(inputs(dtype, r), pre) for r in ranks]
    total = scaled[0].clone()
    for t in scaled[1:]:
        total += t
    factor = post / len(ranks) if op == hvd.Average else post
    return horovod_scale(total, factor)


@pytest.mark.parametrize("pre,post", FACTORS, ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", INTS + FLOATS, ids=str)
def test_allreduce_scales_as_horovod(dtype, op, pre, post):
    x = inputs(dtype, hvd.rank())
    want = reference(dtype, op, pre, post, range(hvd.size()))
    tag = "scale.%s.%s.%s.%s" % (dtype, op.name, pre, post)
    out = hvd.allreduce(x, name=tag, op=op, prescale_factor=pre, postscale_factor=post)
    same(out, want, "allreduce")
    y = x.clone()
    hvd.allreduce_(y, name=tag + ".in", op=op, prescale_factor=pre, postscale_factor=post)
    same(y, want, "allreduce_")


@pytest.mark.parametrize("pre,post", FACTORS, ids=str)
@pytest.mark.parametrize("dtype", INTS + FLOATS, ids=str)
def test_grouped_allreduce_scales_as_horovod(dtype, pre, post):
    xs = [inputs(dtype, hvd.rank()), inputs(dtype, hvd.rank())[:7]]
    want = reference(dtype, hvd.Average, pre, post, range(hvd.size()))
    outs = hvd.grouped_allreduce(xs, name="gscale.%s.%s.%s" % (dtype, pre, post),
                                 op=hvd.Average, prescale_factor=pre, postscale_factor=post)
    same(outs[0], want, "grouped_allreduce[0]")
    same(outs[1], want[:7], "grouped_allreduce[1]")


@pytest.mark.parametrize("pre,post", FACTORS, ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", INTS + FLOATS, ids=str)
def test_reducescatter_scales_as_horovod(dtype, op, pre, post):
    n, r = hvd.size(), hvd.rank()
    x = inputs(dtype, r, 4 * n)
    scaled = [horovod_scale(inputs(dtype, q, 4 * n), pre) for q in range(n)]
    total = scaled[0].clone()
    for t in scaled[1:]:
        total += t
    want = horovod_scale(total, post / n if op == hvd.Average else post)[4 * r:4 * r + 4]
    out = hvd.reducescatter(x, name="rsscale.%s.%s.%s.%s" % (dtype, op.name, pre, post), op=op,
                            prescale_factor=pre, postscale_factor=post)
    same(out, want, "reducescatter")
    outs = hvd.grouped_reducescatter([x], name="grsscale.%s.%s.%s.%s" % (dtype, op.name, pre, post),
                                     op=op, prescale_factor=pre, postscale_factor=post)
    same(outs[0], want, "grouped_reducescatter")
