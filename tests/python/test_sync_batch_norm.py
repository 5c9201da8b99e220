"""hvd.SyncBatchNorm against torch's BatchNorm over the whole batch.

Every rank builds the same global batch (fixed seeds) and keeps its own
slice of it. The reference is one torch.nn.BatchNorm in float64 over the
concatenated batch, with loss sum(y * g) for a fixed g. Each rank's loss is
sum(y_r * g_r) over its slice, so the global loss is the sum of the ranks'
losses. Convention checked: the input gradient on a rank is its slice of
the reference input gradient (SyncBatchNorm's backward reduces over the
ranks itself), and the weight and bias gradients are each rank's share:
their Sum over the set is the reference gradient.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import hora.torch as hvd

C = 3
SPATIAL = {2: (), 3: (5,), 4: (3, 4), 5: (2, 3, 2)}
REF = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
       5: torch.nn.BatchNorm3d}


def check(cond, message):
    # pytest.fail: a failed assert reads "no option named 'verbose'" under -p no:terminal
    if not cond:
        pytest.fail(message)


def mismatch(a, b, what, rtol=1e-9, atol=1e-10):
    """Why a is not b within tolerance, or None."""
    if a.shape != b.shape:
        return "%s: shape %s, expected %s" % (what, tuple(a.shape), tuple(b.shape))
    err = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    tol = atol + rtol * (b.double().abs().max().item() if b.numel() else 0.0)
    if not err <= tol:
        return "%s: max error %g > %g (rank %d)" % (what, err, tol, hvd.rank())
    return None


def close(a, b, what, rtol=1e-9, atol=1e-10):
    check(mismatch(a, b, what, rtol, atol) is None, mismatch(a, b, what, rtol, atol))


def counts_for(split, n):
    """Per-rank batch sizes of a set of n ranks."""
    if split == "even":
        return [3] * n
    if split == "uneven":
        return [2 + (3 * r) % 5 for r in range(n)]  # 2, 5, 3, 6
    if split == "empty":  # the first rank has no samples at all
        return [0] + [r + 1 for r in range(1, n)] if n > 1 else [4]
    raise ValueError(split)


def run_steps(dim, counts, my, ps, steps=3, momentum=0.1, dtype=torch.float64, offset=0.0,
              seed=0, affine=True, check_exact_single=False):
    """Trains SyncBatchNorm (on this rank's slice `my` of each global batch)
    and the reference for `steps` steps, checking output and gradients at
    each and the running statistics at the end. Returns both modules."""
    torch.manual_seed(seed)
    sync = hvd.SyncBatchNorm(C, momentum=momentum, affine=affine, process_set=ps).to(dtype)
    ref = REF[dim](C, momentum=momentum, affine=affine).double()
    check(isinstance(sync, _BatchNorm), "SyncBatchNorm is not a _BatchNorm")
    if affine:
        with torch.no_grad():
            w, b = torch.randn(C) + 1.5, torch.randn(C)
            sync.weight.copy_(w)
            sync.bias.copy_(b)
            ref.weight.copy_(w)
            ref.bias.copy_(b)
    start = sum(counts[:my])
    errors = []  # failing at once on one rank would leave the others in a collective

    def close(a, b, what, rtol=1e-9, atol=1e-10):
        errors.append(mismatch(a, b, what, rtol, atol))

    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * seed + step)
        shape = (sum(counts), C) + SPATIAL[dim]
        # per-channel scales and offsets so that channels differ
        scale = torch.rand(C, generator=g, dtype=torch.float64) * 3 + 0.5
        x = (torch.randn(shape, generator=g, dtype=torch.float64)
             * scale.view([1, C] + [1] * (dim - 2)) + offset + torch.arange(C).view(
                 [1, C] + [1] * (dim - 2)))
        x = x.to(dtype)  # the batch both see: the reference gets it in float64
        gy = torch.randn(shape, generator=g, dtype=torch.float64)
        xr = x.double().clone().requires_grad_()
        yr = ref(xr)
        (yr * gy).sum().backward()

        xs = x[start:start + counts[my]].clone().requires_grad_()
        ys = sync(xs)
        (ys * gy[start:start + counts[my]].to(dtype)).sum().backward()
        tol = {} if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
        close(ys, yr[start:start + counts[my]], "output at step %d" % step, **tol)
        close(xs.grad, xr.grad[start:start + counts[my]], "input grad at step %d" % step, **tol)
        if check_exact_single:
            # one rank: torch's BatchNorm itself (training output ignores running stats)
            plain = REF[dim](C, momentum=momentum, affine=affine).to(dtype)
            if affine:
                plain.load_state_dict(sync.state_dict())
            if not torch.equal(plain(xs.detach()), ys.detach()):
                errors.append("one rank: not torch's output")
        if affine:
            for name in ("weight", "bias"):
                local = getattr(sync, name).grad
                total = hvd.allreduce(local, op=hvd.Sum, name="test_sbn.%s" % name, process_set=ps)
                close(total, getattr(ref, name).grad, "%s grad at step %d" % (name, step), **tol)
                getattr(sync, name).grad = None
                getattr(ref, name).grad = None
    tol = {} if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    close(sync.running_mean, ref.running_mean, "running_mean", **tol)
    close(sync.running_var, ref.running_var, "running_var", **tol)
    if not int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == steps:
        errors.append("num_batches_tracked %d, expected %d" % (int(sync.num_batches_tracked),
                                                                steps))
    errors = [e for e in errors if e]
    check(not errors, "; ".join(errors[:3]))
    return sync, ref, x, start


@pytest.mark.parametrize("dim", [2, 3, 4, 5])
@pytest.mark.parametrize("split", ["even", "uneven", "empty"])
def test_train_matches_global_batch_norm(dim, split):
    counts = counts_for(split, hvd.size())
    run_steps(dim, counts, hvd.rank(), hvd.global_process_set,
              check_exact_single=hvd.size() == 1)


@pytest.mark.parametrize("momentum", [None, 0.3])
def test_momentum(momentum):
    # None: the cumulative average of the global batches' statistics
    run_steps(4, counts_for("uneven", hvd.size()), hvd.rank(), hvd.global_process_set,
              steps=4, momentum=momentum)


def test_no_affine():
    run_steps(3, counts_for("uneven", hvd.size()), hvd.rank(), hvd.global_process_set,
              affine=False)


def test_float32_large_offset():
    # mean 1e3, spread ~1: variance from sum(x^2) - N mean^2 in float32 would be lost
    run_steps(4, counts_for("uneven", hvd.size()), hvd.rank(), hvd.global_process_set,
              dtype=torch.float32, offset=1000.0)


def test_eval_uses_running_stats():
    sync, ref, x, start = run_steps(4, counts_for("uneven", hvd.size()), hvd.rank(),
                                    hvd.global_process_set)
    sync.eval()
    ref.eval()
    n = counts_for("uneven", hvd.size())[hvd.rank()]
    mine = x[start:start + n]
    before = sync.running_mean.clone(), sync.running_var.clone()
    close(sync(mine), ref(x)[start:start + n], "eval output")
    # eval: exactly torch's BatchNorm with the same state, no collective, no update
    close(sync(mine), F.batch_norm(mine, before[0], before[1], sync.weight, sync.bias, False,
                                   0.0, sync.eps), "eval output vs F.batch_norm", 0, 0)
    check(torch.equal(sync.running_mean, before[0]) and torch.equal(sync.running_var, before[1]),
          "eval changed the running statistics")


def test_eval_without_running_stats_is_local():
    # As torch's BatchNorm: eval with no running statistics normalises by the
    # local batch; nothing is synchronised outside training.
    torch.manual_seed(5)
    sync = hvd.SyncBatchNorm(C, track_running_stats=False).double().eval()
    plain = torch.nn.BatchNorm2d(C, track_running_stats=False).double().eval()
    x = torch.randn(2 + hvd.rank(), C, 3, 3, dtype=torch.float64) * (hvd.rank() + 1)
    check(torch.equal(sync(x), plain(x)), "eval without running stats differs from BatchNorm2d")


def test_train_without_running_stats():
    counts = counts_for("uneven", hvd.size())
    start = sum(counts[:hvd.rank()])
    g = torch.Generator().manual_seed(77)
    x = torch.randn((sum(counts), C, 4), generator=g, dtype=torch.float64) * 2 + 1
    sync = hvd.SyncBatchNorm(C, track_running_stats=False).double()
    ref = torch.nn.BatchNorm1d(C, track_running_stats=False).double()
    check(sync.running_mean is None, "running_mean kept without track_running_stats")
    close(sync(x[start:start + counts[hvd.rank()]]),
          ref(x)[start:start + counts[hvd.rank()]], "output without running stats")


def test_process_set_halves():
    n = hvd.size()
    if n < 2 or n % 2:
        pytest.skip("needs an even number of ranks")
    halves = [list(range(n // 2)), list(range(n // 2, n))]
    sets = [hvd.add_process_set(h) for h in halves]
    try:
        which = 0 if hvd.rank() < n // 2 else 1
        ps = sets[which]
        counts = [2 + 3 * r for r in range(n // 2)]
        # each half its own global batch (seed) and its own statistics
        run_steps(4, counts, ps.rank(), ps, seed=10 + which, check_exact_single=n == 2)
    finally:
        for s in sets:
            hvd.remove_process_set(s)


def test_too_few_values_raises():
    # one value per channel over the whole set: torch's BatchNorm refuses it in training
    sync = hvd.SyncBatchNorm(C).double()
    x = torch.randn(1 if hvd.rank() == 0 else 0, C, dtype=torch.float64)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        sync(x)


def test_exported():
    check("SyncBatchNorm" in hvd.__all__, "SyncBatchNorm not in hora.torch.__all__")
    with pytest.raises(ValueError):
        hvd.SyncBatchNorm(C)(torch.randn(4, C + 1))
