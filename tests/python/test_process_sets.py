"""Process sets: ProcessSet, add_process_set and remove_process_set, every
collective and the functions and optimizer built on them within a set, and
the errors for sets a rank is not in or that were removed. Every rank adds
and removes every set (collective over the job); only members run the
set's collectives."""
import pytest
import torch
import torch.nn as nn

import hora.torch as hvd

needs_peers = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks")


@pytest.fixture
def parity():
    """The evens' set, the odds' set, this rank's and the other (every rank
    adds both). Tests that use it need 2 ranks: with one the odds are none."""
    n = hvd.size()
    evens = hvd.add_process_set(range(0, n, 2))
    odds = hvd.add_process_set(range(1, n, 2))
    mine, other = (evens, odds) if hvd.rank() % 2 == 0 else (odds, evens)
    yield evens, odds, mine, other
    assert hvd.remove_process_set(odds) and hvd.remove_process_set(evens)


def test_global_process_set():
    g = hvd.global_process_set
    assert isinstance(g, hvd.ProcessSet)
    assert g.process_set_id == 0 and g.ranks == list(range(hvd.size()))
    assert g.size() == hvd.size() and g.rank() == hvd.rank() and g.included()
    assert repr(g).startswith("ProcessSet(process_set_id=0, ")
    assert hvd.remove_process_set(g) is False
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.global", process_set=g)
    assert torch.equal(out, torch.full((2,), float(hvd.size())))


def test_a_set_made_before_registration_is_registered_by_init():
    n = hvd.size()
    ps = hvd.ProcessSet(reversed(range(n)))
    assert ps.ranks == list(range(n)) and ps.process_set_id is None
    assert ps.size() is None and ps.rank() is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), name="ps.early", process_set=ps)
    hvd.init(process_sets=[ps])  # running already: registers what it is given
    assert ps.process_set_id > 0 and ps.size() == n and ps.rank() == hvd.rank()
    out = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ps.early", process_set=ps)
    assert out.item() == n
    assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None and ps.size() is None
    assert hvd.remove_process_set(ps) is False


def test_bad_arguments_are_refused_on_every_rank():
    with pytest.raises(ValueError, match="list of global ranks"):
        hvd.ProcessSet(3)
    with pytest.raises(ValueError, match="list of global ranks"):
        hvd.ProcessSet(["a"])
    with pytest.raises(TypeError, match="process_set must be a hvd.ProcessSet, got list"):
        hvd.allreduce(torch.ones(1), process_set=[0])
    with pytest.raises(TypeError, match="process_set must be a hvd.ProcessSet"):
        hvd.barrier(process_set="evens")
    with pytest.raises(TypeError, match="expected a hvd.ProcessSet"):
        hvd.remove_process_set([0])
    with pytest.raises(ValueError, match="dynamic"):
        hvd.init(process_sets="static")
    with pytest.raises(TypeError, match="hvd.ProcessSet objects"):
        hvd.init(process_sets=[[0]])
    # libhora checks the ranks, and every rank learns the verdict.
    with pytest.raises(ValueError, match="not a rank of the job"):
        hvd.add_process_set([0, hvd.size()])
    with pytest.raises(ValueError, match="listed twice"):
        hvd.add_process_set([0, 0])
    with pytest.raises(ValueError, match="out of range"):
        hvd.add_process_set([])
    out = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ps.after.bad")
    assert out.item() == hvd.size()


def test_a_second_set_of_the_same_ranks_is_refused():
    ps = hvd.add_process_set([0])
    with pytest.raises(ValueError, match=r"ranks \[0\] exists already"):
        hvd.add_process_set([0])
    with pytest.raises(ValueError, match="registered already"):
        hvd.add_process_set(ps)
    assert hvd.remove_process_set(ps)
    assert hvd.add_process_set(ps) is ps and ps.process_set_id is not None  # added again
    assert hvd.remove_process_set(ps)


@needs_peers
def test_members_ranks_and_sizes(parity):
    evens, odds, mine, other = parity
    n, r = hvd.size(), hvd.rank()
    assert evens.ranks == list(range(0, n, 2)) and odds.ranks == list(range(1, n, 2))
    assert 0 < evens.process_set_id < odds.process_set_id
    assert mine.included() and mine.rank() == r // 2 and mine.size() == len(mine.ranks)
    assert other.included() is False and other.size() == len(other.ranks)
    with pytest.raises(ValueError, match="not a member of process set %d" % other.process_set_id):
        other.rank()
    assert "ranks=%s" % mine.ranks in repr(mine)


@needs_peers
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name)
def test_allreduce_within_a_set(parity, op):
    _, _, mine, _ = parity
    x = torch.full((3, 4), float(hvd.rank() + 1), dtype=torch.float64)
    total = float(sum(q + 1 for q in mine.ranks))
    want = torch.full((3, 4), total if op == hvd.Sum else total / mine.size(),
                      dtype=torch.float64)
    tag = "ps.ar." + op.name
    assert torch.equal(hvd.allreduce(x, op=op, name=tag, process_set=mine), want)
    y = x.clone()
    assert hvd.allreduce_(y, op=op, name=tag + "_", process_set=mine) is y
    assert torch.equal(y, want)
    h = hvd.allreduce_async(x, op=op, name=tag + ".async", process_set=mine)
    assert torch.equal(hvd.synchronize(h), want)
    z = x.clone()
    h = hvd.allreduce_async_(z, op=op, name=tag + ".async_", process_set=mine)
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h) is z and torch.equal(z, want)
    scaled = hvd.allreduce(x, op=op, name=tag + ".scaled", prescale_factor=2.0,
                           postscale_factor=0.5, process_set=mine)
    assert torch.equal(scaled, want)


@needs_peers
def test_unnamed_operations_are_numbered_per_set(parity):
    _, _, mine, _ = parity
    # The odds run more unnamed allreduces in their set than the evens:
    # the world's unnamed ones still match.
    for i in range(1 + hvd.rank() % 2 * 2):
        out = hvd.allreduce(torch.full((2,), float(i)), op=hvd.Sum, process_set=mine)
        assert torch.equal(out, torch.full((2,), float(i * mine.size())))
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(hvd.size())))


@needs_peers
def test_broadcast_root_is_a_global_rank_of_the_set(parity):
    _, _, mine, other = parity
    r = hvd.rank()
    for root in mine.ranks:
        x = torch.full((2, 3), float(r))
        want = torch.full((2, 3), float(root))
        tag = "ps.bc.%d" % root
        out = hvd.broadcast(x, root, name=tag, process_set=mine)
        assert torch.equal(out, want) and torch.equal(x, torch.full((2, 3), float(r)))
        y = x.clone()
        assert hvd.broadcast_(y, root, name=tag + "_", process_set=mine) is y
        assert torch.equal(y, want)
        h = hvd.broadcast_async(x, root, name=tag + ".async", process_set=mine)
        assert torch.equal(hvd.synchronize(h), want)
        h = hvd.broadcast_async_(x, root, name=tag + ".async_", process_set=mine)
        assert hvd.synchronize(h) is x and torch.equal(x, want)
    with pytest.raises(ValueError, match="root_rank %d is not a member of process set %d"
                       % (other.ranks[0], mine.process_set_id)):
        hvd.broadcast(torch.ones(1), other.ranks[0], name="ps.bc.bad", process_set=mine)


@needs_peers
def test_allgather_within_a_set_with_different_first_dimensions(parity):
    _, _, mine, _ = parity
    r = hvd.rank()
    want = torch.cat([torch.full((q + 1, 2), q) for q in mine.ranks])
    assert torch.equal(hvd.allgather(torch.full((r + 1, 2), r), name="ps.ag",
                                     process_set=mine), want)
    # Between its phases, this rank waits on a world allgather first.
    h = hvd.allgather_async(torch.full((r + 1, 2), r), name="ps.ag.async", process_set=mine)
    w = hvd.allgather_async(torch.full((1,), r), name="ps.ag.async")
    assert torch.equal(hvd.synchronize(w), torch.arange(hvd.size()))
    assert torch.equal(hvd.synchronize(h), want)


@needs_peers
def test_gradients_stay_within_the_set(parity):
    _, _, mine, _ = parity
    r, members = hvd.rank(), mine.ranks
    # Every collective first, the checks after: a rank whose check fails
    # must not leave the others waiting in the set.
    xg = torch.full((r + 1, 2), float(r), requires_grad=True)
    y = hvd.allgather(xg, name="ps.grad.ag", process_set=mine)
    w = torch.arange(y.numel(), dtype=torch.float32).view_as(y)
    (y * w).sum().backward()
    root = members[-1]
    xb = torch.ones(3, requires_grad=True)
    (hvd.broadcast(xb, root, name="ps.grad.bc", process_set=mine) * (r + 1)).sum().backward()
    xr = torch.ones(3, requires_grad=True)
    hvd.allreduce(xr, op=hvd.Sum, name="ps.grad.ar", process_set=mine).sum().backward()

    offset = sum(q + 1 for q in members[:mine.rank()])  # rows before this rank's, in set order
    assert torch.equal(xg.grad, w[offset:offset + r + 1])
    mean = sum(q + 1 for q in members) / len(members)
    assert torch.allclose(xb.grad, torch.full((3,), mean if r == root else 0.0))
    assert torch.equal(xr.grad, torch.full((3,), float(len(members))))


@needs_peers
def test_the_same_names_in_a_set_and_the_world_at_once(parity):
    _, _, mine, _ = parity
    r, n = hvd.rank(), hvd.size()
    x = torch.full((4,), float(r + 1))
    hs = hvd.allreduce_async(x, op=hvd.Sum, name="ps.same", process_set=mine)
    hw = hvd.allreduce_async(x, op=hvd.Sum, name="ps.same")
    gs = hvd.allgather_async(torch.full((r + 1,), r), name="ps.same", process_set=mine)
    gw = hvd.allgather_async(torch.full((r + 1,), r), name="ps.same")
    # Waited on in the other order: the set does not wait for the world.
    assert torch.equal(hvd.synchronize(gw), torch.cat([torch.full((q + 1,), q)
                                                       for q in range(n)]))
    assert torch.equal(hvd.synchronize(hw), torch.full((4,), float(sum(range(1, n + 1)))))
    assert torch.equal(hvd.synchronize(gs), torch.cat([torch.full((q + 1,), q)
                                                       for q in mine.ranks]))
    assert torch.equal(hvd.synchronize(hs),
                       torch.full((4,), float(sum(q + 1 for q in mine.ranks))))


@needs_peers
def test_overlapping_sets_run_the_same_names_at_once():
    n, r = hvd.size(), hvd.rank()
    a = hvd.add_process_set(range(0, n // 2 + 1))
    b = hvd.add_process_set(range(n // 2, n))
    assert set(a.ranks) & set(b.ranks) == {n // 2}
    x = torch.full((3,), float(r + 1))
    pending = []
    for ps in (a, b):
        if ps.included():
            pending.append((ps, hvd.allreduce_async(x, op=hvd.Sum, name="ps.ov", process_set=ps),
                            hvd.allgather_async(torch.full((1,), r), name="ps.ov",
                                                process_set=ps)))
    for ps, hr, hg in reversed(pending):
        assert torch.equal(hvd.synchronize(hg), torch.tensor(ps.ranks))
        assert torch.equal(hvd.synchronize(hr),
                           torch.full((3,), float(sum(q + 1 for q in ps.ranks))))
    assert hvd.remove_process_set(b) and hvd.remove_process_set(a)


@needs_peers
def test_barrier_within_a_set(parity):
    _, _, mine, _ = parity
    # The evens pass their set's barrier three times, the odds once: no
    # barrier of a set waits on ranks outside it.
    for _ in range(3 if hvd.rank() % 2 == 0 else 1):
        hvd.barrier(process_set=mine)
    hvd.barrier()


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))


def member_batch(step, q):
    g = torch.Generator().manual_seed(1000 * step + q)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


@needs_peers
def test_broadcast_parameters_and_distributed_optimizer_within_a_set(parity):
    _, _, mine, _ = parity
    r, members = hvd.rank(), mine.ranks
    root = members[-1]
    model = make_model(100 + r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
    ref = make_model(100 + root)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=mine)
    loss_fn = nn.MSELoss()
    for step in range(3):
        x, y = member_batch(step, r)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        # By hand: the members' gradients averaged, nobody else's.
        grads = []
        for q in members:
            ref.zero_grad()
            xq, yq = member_batch(step, q)
            loss_fn(ref(xq), yq).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for i, p in enumerate(ref.parameters()):
                p -= 0.1 * sum(g[i] for g in grads) / len(grads)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a, b)


def test_distributed_optimizer_on_a_rank_outside_its_set_uses_its_own_gradients():
    first = hvd.add_process_set([0])
    model, ref = make_model(3), make_model(3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=first)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for m, o in ((model, opt), (ref, ref_opt)):
        x, y = member_batch(0, hvd.rank())
        o.zero_grad()
        nn.MSELoss()(m(x), y).backward()
        o.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    assert hvd.remove_process_set(first)


@needs_peers
def test_objects_and_optimizer_state_within_a_set(parity):
    _, _, mine, _ = parity
    r, members = hvd.rank(), mine.ranks
    root = members[-1]
    got = hvd.broadcast_object({"from": r} if r == root else None, root_rank=root,
                               name="ps.obj", process_set=mine)
    assert got == {"from": root}
    assert hvd.allgather_object(r, name="ps.objs", process_set=mine) == members
    torch.manual_seed(r)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if r == root:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        opt.param_groups[0]["lr"] = 0.5 + root
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
    hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=mine)
    assert opt.param_groups[0]["lr"] == 0.5 + root
    flat = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name="ps.momentum", process_set=mine)
    assert all(torch.equal(every[i], every[0]) for i in range(len(members)))


@needs_peers
def test_a_rank_outside_a_set_gets_value_errors():
    n = hvd.size()
    last = hvd.add_process_set([n - 1])
    if last.included():
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ps.last", process_set=last)
        assert torch.equal(out, torch.ones(2))
    else:
        calls = [
            lambda: hvd.allreduce(torch.ones(2), name="ps.nm", process_set=last),
            lambda: hvd.allreduce_async_(torch.ones(2), name="ps.nm", process_set=last),
            lambda: hvd.allgather(torch.ones(2), name="ps.nm", process_set=last),
            lambda: hvd.broadcast(torch.ones(2), n - 1, name="ps.nm", process_set=last),
            lambda: hvd.barrier(process_set=last),
        ]
        for call in calls:
            with pytest.raises(ValueError, match="not a member of process set %d"
                               % last.process_set_id):
                call()
    assert hvd.remove_process_set(last)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ps.after.nm").item() == n


def test_a_removed_set_raises_value_errors():
    ps = hvd.add_process_set(range(hvd.size()))
    assert hvd.remove_process_set(ps)
    model = nn.Linear(2, 2)
    calls = [
        lambda: hvd.allreduce(torch.ones(2), name="ps.rm", process_set=ps),
        lambda: hvd.allreduce_async_(torch.ones(2), name="ps.rm", process_set=ps),
        lambda: hvd.allgather_async(torch.ones(2), name="ps.rm", process_set=ps),
        lambda: hvd.broadcast_(torch.ones(2), 0, name="ps.rm", process_set=ps),
        lambda: hvd.barrier(process_set=ps),
        lambda: hvd.broadcast_parameters(model.state_dict(), 0, process_set=ps),
        lambda: hvd.broadcast_object(1, 0, process_set=ps),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         process_set=ps),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="not registered"):
            call()
    assert hvd.remove_process_set(ps) is False


def test_add_and_remove_twenty_times():
    n, ids = hvd.size(), []
    for i in range(20):
        ranks = [q for q in range(n) if (q + i) % 2 == 0] or [0]
        ps = hvd.add_process_set(ranks)
        ids.append(ps.process_set_id)
        if ps.included():
            # The same name each time: each set is new.
            out = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ps.cycle", process_set=ps)
            assert out.item() == len(ranks)
        assert hvd.remove_process_set(ps)
    assert ids == sorted(set(ids))


def test_a_set_from_an_mpi4py_communicator():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    from mpi4py import MPI
    r, n = hvd.rank(), hvd.size()
    comm = MPI.COMM_WORLD.Split(r % 2, r)
    try:
        ps = hvd.add_process_set(hvd.ProcessSet(comm))
        assert ps.ranks == [q for q in range(n) if q % 2 == r % 2]
        assert ps.rank() == comm.Get_rank() and ps.size() == comm.Get_size()
        out = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, name="ps.comm",
                            process_set=ps)
        assert torch.equal(out, torch.full((2,), float(sum(ps.ranks))))
        assert hvd.remove_process_set(ps)
    finally:
        comm.Free()
