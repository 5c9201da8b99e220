"""DistributedOptimizer: n ranks with batch B follow one process with batch
nB; gradient accumulation, compression, join with uneven shards, sparse
gradients, and the errors Horovod raises."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import hora.torch as hvd

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


def make_model(seed=7):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(),
                         nn.Linear(8, 3))


def batch(step, n, seed=11):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(n, 12, generator=g)
    y = torch.randn(n, 3, generator=g)
    return x, y


def max_param_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def identical_on_every_rank(model, name):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    every = hvd.allgather(flat.unsqueeze(0), name=name)
    return all(torch.equal(every[r], every[0]) for r in range(hvd.size()))


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01),
], ids=["sgd_momentum", "adam"])
def test_n_ranks_with_batch_b_follow_one_process_with_batch_nb(make_opt):
    n, r, B = hvd.size(), hvd.rank(), 8
    model, ref = make_model(), make_model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters())
    ref_opt = make_opt(ref.parameters())
    loss_fn = nn.MSELoss()
    for step in range(50):
        x, y = batch(step, n * B)
        opt.zero_grad()
        loss_fn(model(x[r * B:(r + 1) * B]), y[r * B:(r + 1) * B]).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
    assert max_param_diff(model, ref) < 1e-5


def test_backward_passes_per_step_matches_the_larger_batch():
    n, r, B, k = hvd.size(), hvd.rank(), 4, 4
    model, ref = make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=k)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()
    for step in range(20):
        x, y = batch(step, n * k * B, seed=13)
        opt.zero_grad()
        for m in range(k):
            lo = (m * n + r) * B
            (loss_fn(model(x[lo:lo + B]), y[lo:lo + B]) / k).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
    assert max_param_diff(model, ref) < 1e-5


@needs_peers
def test_more_backward_passes_than_declared_raise():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    x, y = batch(0, 4)
    for _ in range(2):
        nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        nn.functional.mse_loss(model(x), y).backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()


@needs_peers
def test_zero_grad_with_pending_allreduces_raises():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = batch(0, 4)
    nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_named_parameters_errors():
    model = make_model()
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicates: 0.weight"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=params + [params[0]])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=params[1:])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[p for _, p in params])
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 op=hvd.Sum, gradient_predivide_factor=2.0)


def test_explicit_synchronize_for_gradient_clipping():
    n, r, B = hvd.size(), hvd.rank(), 4
    model, ref = make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(5):
        x, y = batch(step, n * B, seed=17)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[r * B:(r + 1) * B]), y[r * B:(r + 1) * B]).backward()
        opt.synchronize()
        nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
    assert max_param_diff(model, ref) < 1e-5
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.zero_grad()
        nn.functional.mse_loss(model(x[:B]), y[:B]).backward()
        opt.synchronize()
        opt.step()
    assert hvd.size() == 1 or any("skip_synchronize" in str(m.message) for m in w)


def test_fp16_compression_converges():
    torch.manual_seed(3)
    w_true = torch.randn(10, 1)
    model = nn.Linear(10, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    g = torch.Generator().manual_seed(50 + hvd.rank())
    first = None
    for _ in range(200):
        x = torch.randn(32, 10, generator=g)
        loss = nn.functional.mse_loss(model(x), x @ w_true)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.01 * first
    assert identical_on_every_rank(model, "fp16.params")
    assert model.weight.dtype == torch.float32


def test_bf16_compressor_roundtrip():
    x = torch.randn(100)
    c, ctx = hvd.Compression.bf16.compress(x)
    assert c.dtype == torch.bfloat16
    out = hvd.Compression.bf16.decompress(hvd.allreduce(c, name="bf16.c"), ctx)
    assert out.dtype == torch.float32


def test_join_with_uneven_shards_ends_with_identical_parameters():
    r = hvd.rank()
    model = make_model(seed=21 + r)  # different on purpose: the broadcast makes them equal
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(3 + 2 * r):  # rank r has 3 + 2r batches
        x, y = batch(step, 6, seed=31 + r)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    last = hvd.join()
    assert last == hvd.size() - 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    assert identical_on_every_rank(model, "join.params")


def test_sparse_gradients():
    n, r = hvd.size(), hvd.rank()
    for as_dense in (False, True):
        torch.manual_seed(5)
        emb = nn.Embedding(20, 4, sparse=True)
        ref = copy.deepcopy(emb)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=[("emb%d" % as_dense, emb.weight)],
                                       sparse_as_dense=as_dense)
        idx = torch.tensor([[q, q + 3, 7] for q in range(n)])
        opt.zero_grad()
        emb(idx[r]).sum().backward()
        opt.step()
        ref_grad = torch.zeros(20, 4)
        for q in range(n):
            ref_grad.index_add_(0, idx[q], torch.ones(3, 4))
        assert torch.allclose(emb.weight, ref.weight - 0.5 * ref_grad / n, atol=1e-6)


@pytest.mark.parametrize("grouping", ["num_groups", "groups"])
def test_explicit_groups_follow_one_process_with_batch_nb(grouping):
    n, r, B = hvd.size(), hvd.rank(), 4
    model, ref = make_model(), make_model()
    params = list(model.parameters())
    extra = {"num_groups": 2} if grouping == "num_groups" else \
        {"groups": [params[:3], params[3:]]}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), **extra)
    assert len(opt._group_members) == 2
    submitted = []
    real = opt._submit_group
    opt._submit_group = lambda gid: (submitted.append(gid), real(gid))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()
    for step in range(10):
        x, y = batch(step, n * B)
        opt.zero_grad()
        loss_fn(model(x[r * B:(r + 1) * B]), y[r * B:(r + 1) * B]).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
    assert max_param_diff(model, ref) < 1e-5
    if n > 1:
        assert sorted(set(submitted)) == [0, 1], submitted


def test_groups_errors():
    model = make_model()
    with pytest.raises(ValueError, match="list of lists"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), groups=[1, 2])
    with pytest.raises(ValueError, match="not a parameter"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 groups=[[torch.zeros(2)]])
