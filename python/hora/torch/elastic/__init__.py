"""Horovod's elastic training for PyTorch (hvd.elastic): a job that loses
processes goes on with the survivors, and admits processes started later at
a commit point. Enabled by HORA_ELASTIC=1 (or Horovod's HOROVOD_ELASTIC=1).

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([rescale_learning_rate])
    train(state)

A reset is hora_elastic_reset (no shutdown and init as in Horovod): the
runtime and everything not tied to the old membership stay; what was
(requests in flight, process sets, DistributedOptimizer's pending
gradients) is dropped, and process sets must be made again, in a reset
callback (their old objects raise a ValueError saying so) and at start-up:
as in Horovod, a process that joins runs no reset callback.
"""
from hora import _lib as L
from hora.common.elastic import NothingToReset, ObjectState, State, run_fn
from hora.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from hora.torch import mpi_ops as _ops, optimizer as _optimizer
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]


def run(func):
    """Decorates train(state, ...) to run on as workers come and go: state is
    synced from rank 0 before the first try and after every reset; a failed
    collective (HorovodInternalError) restores the last commit, resets and
    tries again; a HostsUpdatedInterrupt (raised by state.commit() or
    state.check_host_updates() when processes wait to join) resets and tries
    again from where it was. Before train is called, run no collective but
    those the reset callbacks run, in their order (making process sets): a
    process joining later runs that code where the survivors run the
    callbacks, and then syncs with them."""
    return run_fn(func, _reset)


def _reset():
    """The new membership: every survivor calls it after a failure, every
    member after a commit point reported a change."""
    lib = L.load()
    if not lib.has_elastic:
        raise NotImplementedError("hora.torch.elastic: %s has no hora_elastic_reset; it is older "
                                  "than this package" % lib.path)
    rc = lib.hora_elastic_reset()
    if rc == L.ERR_INVALID_USAGE:
        raise NothingToReset("hora_elastic_reset: " + (lib.last_error() or lib.strerror(rc)), rc)
    L.check(rc, "hora_elastic_reset")
    _ops._membership_changed()
    _optimizer._membership_changed()
