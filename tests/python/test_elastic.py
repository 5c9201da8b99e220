"""hvd.elastic without a change of membership: ElasticSampler's split of an
epoch over 1 to 5 ranks (its rank and size set by the test) against splits
worked out by hand; ObjectState and TorchState save, restore, commit and
sync; run's loop (sync, restore, reset, callbacks) around a reset the test
stands in for; what a reset drops in the optimizer and the process sets.
Losing a rank for real is tests/python/elastic_train.py's."""

import pytest
import torch
import torch.nn as nn

import hora.torch as hvd
from hora import _lib as L
from hora.common import elastic as common
from hora.torch import mpi_ops, optimizer as opt_mod
from hora.torch.elastic import sampler as sampler_mod

@pytest.fixture
def world(monkeypatch):
    """set(n, r): the sampler sees a job of n ranks where this one is r."""
    def set_world(n, r):
        monkeypatch.setattr(sampler_mod, "size", lambda: n)
        monkeypatch.setattr(sampler_mod, "rank", lambda: r)
    return set_world


def split(sampler, world, n):
    """What every rank of n would iterate, rank by rank."""
    out = []
    for r in range(n):
        world(n, r)
        sampler.reset()
        out.append(list(sampler))
        assert len(sampler) == len(out[-1])
    return out


# An unshuffled epoch of 10 samples over n ranks: each takes every n-th
# sample from its rank on, the epoch padded from its start to a multiple of n.
BY_HAND = {
    1: [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]],
    2: [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]],
    3: [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]],
    4: [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]],
    5: [[0, 5], [1, 6], [2, 7], [3, 8], [4, 9]],
}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_sampler_splits_an_epoch_over_n_ranks(world, n):
    world(n, 0)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert split(s, world, n) == BY_HAND[n]
    assert s.num_replicas == n and s.total_size == len(BY_HAND[n][0]) * n


def test_sampler_splits_what_is_left_over_the_ranks_there_are_now(world):
    world(4, 1)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    s.record_batch(0, 2)  # 2 samples on each of 4 ranks: 0..7 done
    assert s.processed_num == 8 and s.state_dict()["processed_num"] == 8
    assert split(s, world, 3) == [[8], [9], [8]]
    # Fewer samples left than ranks: each rank still gets one.
    assert split(s, world, 5) == [[8], [9], [8], [9], [8]]
    s.record_batch(1, 1)  # 1 sample on each of 5 ranks: the epoch is done
    assert split(s, world, 2) == [[], []]


def test_sampler_shuffles_by_seed_plus_epoch(world):
    world(3, 0)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=0)
    # random.Random(0) shuffles range(10) to 7 8 1 5 3 4 2 0 9 6, as Horovod's sampler does.
    assert split(s, world, 3) == [[7, 5, 2, 6], [8, 3, 0, 7], [1, 4, 9, 8]]
    world(2, 0)
    s.set_epoch(1)  # Random(1): 6 8 9 7 5 3 0 4 1 2
    assert split(s, world, 2) == [[6, 9, 5, 0, 1], [8, 7, 3, 4, 2]]
    s.record_batch(0, 2)  # 6 8 9 7 done
    assert split(s, world, 4) == [[5, 1], [3, 2], [0, 5], [4, 3]]
    world(2, 0)
    other = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=1)
    assert split(other, world, 2) == [[6, 9, 5, 0, 1], [8, 7, 3, 4, 2]]  # seed 1, epoch 0


def test_set_epoch_starts_the_next_epoch_from_its_beginning(world):
    world(2, 1)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    s.record_batch(0, 3)
    s.record_indices([9])
    assert split(s, world, 2) == [[6, 8], [7, 6]]
    s.set_epoch(1)
    assert s.epoch == 1 and s.processed_num == 0 and s.processed_indices == set()
    assert split(s, world, 2) == BY_HAND[2]


def test_record_indices_leaves_those_samples_out(world):
    world(2, 0)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    s.record_indices(torch.tensor([0, 2, 4]))
    assert s.processed_indices == {0, 2, 4}
    assert split(s, world, 2) == [[1, 5, 7, 9], [3, 6, 8, 1]]


def test_sampler_state_dict_round_trip(world):
    world(3, 2)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=5)
    s.set_epoch(2)
    s.record_batch(0, 1)
    s.record_indices([4])
    sd = s.state_dict()
    assert sd == {"epoch": 2, "processed_num": 3, "processed_indices": {4}}
    t = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=5)
    t.load_state_dict(sd)
    s.reset()  # progress recorded counts from the next reset on (as in Horovod)
    # Random(7): 8 3 1 | 4 7 0 9 6 2 5, the first 3 and sample 4 done; rank 2 of 3.
    assert list(t) == list(s) == [9, 5] and len(t) == len(s) == 2
    # Horovod's state_dict has no processed_indices.
    t.load_state_dict({"epoch": 2, "processed_num": 3})
    assert t.processed_indices == set() and len(t) == 3


def test_sampler_feeds_a_dataloader(world):
    world(2, 1)
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    s = hvd.elastic.ElasticSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=s)
    got = [b[0].tolist() for b in loader]
    assert got == [[1.0, 3.0], [5.0, 7.0], [9.0]]


# ---- State and run's loop ----------------------------------------------------------


def test_exceptions_are_where_horovod_scripts_find_them():
    from hora.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    assert hvd.elastic.HostsUpdatedInterrupt is HostsUpdatedInterrupt
    assert hvd.elastic.HorovodInternalError is HorovodInternalError is hvd.HorovodInternalError
    e = HostsUpdatedInterrupt(True)
    assert isinstance(e, RuntimeError) and e.skip_sync is True
    assert HostsUpdatedInterrupt(skip_sync=False).skip_sync is False
    # A lost peer is a HorovodInternalError (what run recovers from), not a usage error.
    with pytest.raises(HorovodInternalError) as info:
        L.check(L.ERR_PEER_LOST, "allreduce 'x'")
    assert not isinstance(info.value, ValueError) and info.value.code == L.ERR_PEER_LOST


def test_object_state_restore_undoes_what_changed_since_the_last_save():
    s = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0, seen=[])
    s.epoch = 3
    s.seen.append("a")
    s.save()
    s.epoch = 4
    s.seen.append("b")
    s.restore()
    assert s.epoch == 3 and s.seen == ["a"]
    s.seen.append("c")  # the restored value is a copy: the saved one stays
    s.restore()
    assert s.seen == ["a"]


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))


def train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    opt.zero_grad()
    model(torch.randn(8, 4, generator=g)).square().mean().backward()
    opt.step()


def test_torch_state_restore_goes_back_to_the_last_commit():
    model = make_model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(40)))
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    assert state.model is model and state.optimizer is opt and state.sampler is sampler
    train_step(model, opt, 1)
    sampler.record_batch(0, 2)
    sampler.reset()
    state.epoch = 1
    state.save()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    left = list(sampler)
    train_step(model, opt, 2)
    sampler.record_batch(1, 2)
    state.epoch = 2
    assert any(not torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    state.restore()
    assert state.model is model and state.epoch == 1
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(opt.state[p]["momentum_buffer"], m)
               for p, m in zip(model.parameters(), momentum))
    assert sampler.processed_num == 2 * hvd.size() and list(sampler) == left


def test_torch_state_saves_a_model_assigned_to_it():
    state = hvd.elastic.TorchState(make_model(1), None, batch=0)
    assert state.optimizer is None
    other = make_model(2)
    state.model = other
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1)
    state.restore()  # back to other as it was assigned
    assert state.model is other
    assert all(torch.equal(p, q) for p, q in zip(other.parameters(),
                                                 make_model(2).parameters()))


def test_sync_gives_every_rank_rank_0s_state():
    r, n = hvd.rank(), hvd.size()
    model = make_model(10 + r)  # different on every rank
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
    if r == 0:
        train_step(model, opt, 5)  # rank 0 has optimizer state; the others none
    sampler = hvd.elastic.ElasticSampler(list(range(100)), shuffle=False)
    sampler.record_batch(0, 1 + r)
    sampler.record_indices([90 + r])
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=r, tags=["r%d" % r])
    state.sync()
    assert state.epoch == 0 and state.tags == ["r0"]
    flat = torch.cat([v.reshape(-1).double() for v in model.state_dict().values()])
    every = hvd.allgather(flat.unsqueeze(0), name="elastic.sync.model")
    assert all(torch.equal(every[i], every[0]) for i in range(n))
    steps = hvd.allgather(torch.tensor([float(opt.state[model[0].weight]["step"])]),
                          name="elastic.sync.step")
    assert steps.tolist() == [1.0] * n
    exp_avg = opt.state[model[0].weight]["exp_avg"].reshape(1, -1)
    every = hvd.allgather(exp_avg, name="elastic.sync.exp_avg")
    assert all(torch.equal(every[i], every[0]) for i in range(n))
    # Rank 0's progress, and every rank's recorded indices.
    assert sampler.processed_num == n and sampler.processed_indices == {90 + i for i in range(n)}
    assert sampler.num_replicas == n and len(sampler) == -(-(100 - n - n) // n)


class Recorder(common.ObjectState):
    """An ObjectState that logs what run calls on it."""

    def __init__(self, **kwargs):
        self.log = []
        super().__init__(hvd.broadcast_object, hvd.rank, **kwargs)

    def sync(self):
        self.log.append("sync")
        super().sync()

    def restore(self):
        self.log.append("restore")
        super().restore()

    def reset(self):
        self.log.append("reset")


def test_run_syncs_then_runs():
    state = Recorder(x=1)

    @hvd.elastic.run
    def train(state, a, b=0):
        state.log.append("train")
        return a + b + state.x
    assert train(state, 2, b=3) == 6
    assert state.log == ["sync", "train"]


def test_run_restores_resets_and_syncs_after_a_failure_and_skips_as_told():
    calls = []
    state = Recorder(step=0)
    state.register_reset_callbacks([lambda: state.log.append("callback")])
    failures = [hvd.HorovodInternalError("allreduce 'x': peer lost", L.ERR_PEER_LOST),
                hvd.elastic.HostsUpdatedInterrupt(skip_sync=True),
                hvd.elastic.HostsUpdatedInterrupt(skip_sync=False)]

    def train(state):
        state.log.append("train")
        state.step += 1
        if failures:
            raise failures.pop(0)
        return state.step

    def reset():
        calls.append("reset")
        state.log.append("hora_elastic_reset")

    out = common.run_fn(train, reset)(state)
    assert calls == ["reset"] * 3
    assert state.log == [
        "sync", "train",
        "restore", "hora_elastic_reset", "reset", "callback", "sync", "train",  # failure
        "hora_elastic_reset", "reset", "callback", "train",  # skip_sync: no sync, no restore
        "hora_elastic_reset", "reset", "callback", "sync", "train"]
    # Nothing was saved: the failure's restore and the last sync each put
    # the step back to 0 (a commit saves before its interrupt).
    assert out == 1


def test_a_failure_in_a_reset_callback_resets_again():
    state = Recorder(step=0)
    lost = [hvd.HorovodInternalError("add_process_set: peer lost", L.ERR_PEER_LOST)]

    def callback():
        state.log.append("callback")
        if lost:
            raise lost.pop()
    state.register_reset_callbacks([callback])
    failures = [hvd.elastic.HostsUpdatedInterrupt(skip_sync=False)]

    def train(state):
        state.log.append("train")
        if failures:
            raise failures.pop()
        return "done"

    assert common.run_fn(train, lambda: state.log.append("hora_elastic_reset"))(state) == "done"
    assert state.log == ["sync", "train", "hora_elastic_reset", "reset", "callback",
                         "restore", "hora_elastic_reset", "reset", "callback", "sync", "train"]


def test_run_raises_a_failure_no_reset_mends_as_it_came():
    state = Recorder(step=0)
    failure = hvd.HorovodInternalError("allreduce 'x': shapes differ", L.ERR_MISMATCH)

    def train(state):
        state.step += 1
        raise failure

    def reset():
        raise common.NothingToReset("hora_elastic_reset: no peer was lost", L.ERR_INVALID_USAGE)

    with pytest.raises(hvd.HorovodInternalError) as info:
        common.run_fn(train, reset)(state)
    assert info.value is failure and state.step == 0  # restored before the reset was tried
    def interrupted(state):
        raise hvd.elastic.HostsUpdatedInterrupt()

    with pytest.raises(ValueError, match="no peer was lost"):
        common.run_fn(interrupted, reset)(state)
    with pytest.raises(KeyError):  # anything else goes straight through
        common.run_fn(lambda s: {}["k"], reset)(state)


def test_commit_without_a_change_saves_and_goes_on():
    state = hvd.elastic.TorchState(make_model(1), None, epoch=0)
    for epoch in range(1, 4):
        state.epoch = epoch
        state.commit()  # a commit point of every rank: no process waits to join
        state.check_host_updates()
    state.epoch = 7
    state.restore()
    assert state.epoch == 3


def test_run_in_a_job_that_is_not_elastic_raises_the_failure():
    if mpi_ops._elastic_job():
        pytest.skip("the job is elastic")
    state = Recorder(step=0)

    @hvd.elastic.run
    def train(state):
        state.step += 1
        raise hvd.HorovodInternalError("a failure", L.ERR_PEER_LOST)

    with pytest.raises(hvd.HorovodInternalError, match="a failure"):
        train(state)
    assert state.log == ["sync", "restore"] and state.step == 0
    # The runtime is as it was.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic.after").item() == hvd.size()


# ---- what a reset drops -------------------------------------------------------------


def test_an_elastic_job_reduces_gradients_even_on_one_rank(monkeypatch):
    model = make_model(3)
    monkeypatch.setattr(mpi_ops, "_elastic_job", lambda: True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert opt._reduces and opt._grad_accs  # the world may grow
    train_step(model, opt, 4)


def test_a_membership_change_drops_the_optimizers_pending_allreduces(monkeypatch):
    model = make_model(4)
    with monkeypatch.context() as m:
        m.setattr(mpi_ops, "_elastic_job", lambda: True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=2)
    model(torch.randn(3, 4)).sum().backward()
    model(torch.randn(3, 4)).sum().backward()
    assert opt._handles
    # What a failed membership's requests come to: waited for by
    # mpi_ops._membership_changed (they complete here: nothing failed).
    for handle, _ in opt._handles.values():
        hvd.synchronize(handle)
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt_mod._membership_changed()
    assert not opt._handles and set(opt._allreduce_delay.values()) == {2}
    opt.zero_grad()
    train_step(model, opt, 6)
    train_step(model, opt, 7)


def test_a_membership_change_puts_back_parameters_adasum_had_begun_to_step(monkeypatch):
    model = make_model(5)
    before = [p.detach().clone() for p in model.parameters()]
    with monkeypatch.context() as m:
        m.setattr(mpi_ops, "_elastic_job", lambda: True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                       named_parameters=model.named_parameters(), op=hvd.Adasum)
    model(torch.randn(3, 4)).sum().backward()  # each parameter's step begins in its hook
    assert opt._starts
    for handle, _ in opt._handles.values():
        hvd.synchronize(handle)
    opt_mod._membership_changed()
    assert not opt._starts and not opt._handles
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_process_sets_made_before_a_reset_say_so_and_can_be_made_again():
    ps = hvd.add_process_set(list(range(hvd.size())))
    handle = ps._handle
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic.ps", process_set=ps).item() \
        == hvd.size()
    hvd.allreduce(torch.ones(1), name="elastic.unnamed.counted")
    hvd.allreduce(torch.ones(1))  # unnamed: numbered from 0 again after a reset
    mpi_ops._membership_changed()  # as after hora_elastic_reset
    try:
        assert ps.process_set_id is None and ps.size() is None
        assert not mpi_ops.global_process_set._unnamed
        with pytest.raises(ValueError, match="made before the elastic reset.*add it again"):
            hvd.allreduce(torch.ones(1), name="elastic.ps", process_set=ps)
        with pytest.raises(ValueError, match="made before the elastic reset"):
            hvd.DistributedOptimizer(torch.optim.SGD(make_model(1).parameters(), lr=0.1),
                                     process_set=ps)
        assert hvd.remove_process_set(ps) is False
    finally:
        # No reset took place: libhora still holds the set.
        L.check(mpi_ops._lib.hora_process_set_destroy(handle), "destroy")
    assert hvd.add_process_set(ps) is ps  # made again
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic.ps", process_set=ps).item() \
        == hvd.size()
    assert hvd.remove_process_set(ps)
