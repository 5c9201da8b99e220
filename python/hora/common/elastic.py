"""Elastic training without a framework, with Horovod's semantics
(horovod.common.elastic): State, what a training loop keeps identical on
every rank and can roll back to its last commit; ObjectState, a State of
plain Python attributes; run_fn, the loop that runs a training function
again after a failure or a change of membership.

hora needs no driver process: members that lose a peer agree on the next
membership among themselves (hora_elastic_reset), and processes started
later join at a commit point (hora_elastic_commit), where every rank learns
of them at once.
"""
import copy
import ctypes
import functools

from hora import _lib as L
from hora.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["State", "ObjectState", "run_fn", "commit_point", "NothingToReset"]


class NothingToReset(L.HoraValueError):
    """hora_elastic_reset found nothing to do: the job is not elastic, or no
    peer was lost and no change was reported. The failure that led to the
    reset is then not one elastic training recovers from."""


def _elastic_lib(what):
    lib = L.load()
    if not lib.has_elastic:
        raise NotImplementedError("%s: %s has no elastic training (hora_elastic_commit and "
                                  "hora_elastic_reset); it is older than this package"
                                  % (what, lib.path))
    return lib


def commit_point():
    """hora_elastic_commit: collective over the job; True on every rank when
    processes wait to join (the caller then resets). In a job that is not
    elastic nobody can join: False, with nothing sent (as in Horovod, an
    elastic script runs there too)."""
    lib = _elastic_lib("check_host_updates")
    if lib.hora_initialized() and lib.hora_elastic_epoch() < 0:
        return False
    changed = ctypes.c_int(0)
    L.check(lib.hora_elastic_commit(ctypes.byref(changed)), "check_host_updates")
    return bool(changed.value)


class State:
    """What must stay identical on every worker as workers come and go.

    bcast_object(obj) returns rank 0's obj on every rank; get_rank() is this
    worker's rank. Subclasses give save, restore and sync."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """callbacks (functions of no argument) run after every reset, once
        the new membership is built and before the state is synced: e.g. to
        scale the learning rate by the new size, or make process sets again.
        As in Horovod, only on processes that went through the reset: a
        newcomer runs none, so its start-up code must run the collectives
        they run (make the same sets), in the same order."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (what a failure rolls back to), then checks for
        processes waiting to join (see check_host_updates). Collective."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """A commit point, collective over the job: raises
        HostsUpdatedInterrupt on every rank together when processes wait to
        join."""
        if commit_point():
            raise HostsUpdatedInterrupt(False)

    def save(self):
        """Keeps a copy of the state in memory."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last saved state."""
        raise NotImplementedError()

    def sync(self):
        """Gives every rank rank 0's state."""
        raise NotImplementedError()

    def reset(self):
        """Called after a reset, before the callbacks and the sync."""


class ObjectState(State):
    """A State of Python objects, each given as a keyword argument and kept
    as an attribute of that name. save() keeps a deep copy of each, so that
    restore() undoes changes made in place too (Horovod keeps references:
    a list appended to after a commit stays appended to after a restore);
    sync() broadcasts rank 0's saved values."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__(bcast_object, get_rank)

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        # Copies: what the loop changes in place must not reach the saved state.
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def _note(exc, text):
    if hasattr(exc, "add_note"):  # Python 3.11
        exc.add_note(text)


def run_fn(func, reset):
    """func(state, ...) wrapped to run on through failures and membership
    changes: the state is synced from rank 0 before each try; when a
    collective fails (HorovodInternalError) the state is restored to its last
    commit, reset() builds the new membership, the reset callbacks run, and
    func runs again from the synced state; a HostsUpdatedInterrupt resets
    without restoring (and without syncing where it says skip_sync). The
    first try runs no callback (as Horovod's): a process that joins syncs at
    once, while the survivors run the callbacks first. A
    failure in a reset callback is handled as one in func (in Horovod it
    ends the loop).
    A failure that no reset can mend (NothingToReset: the job is not
    elastic, or the error was not a lost peer) is raised as it came."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        # Not on the first try, a newcomer's included (Horovod's run_fn): its
        # start-up code stands in for the callbacks; running them there too
        # would make its sets twice (tests/python/elastic_callbacks.py).
        after_reset = False
        while True:
            failure = None
            try:
                # The callbacks run inside the try: a peer lost while they
                # run collectives of the new membership is one more failure.
                if after_reset:
                    state.on_reset()
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                failure = e
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            try:
                reset()
            except NothingToReset as e:
                if failure is None:
                    raise
                _note(failure, "not recovered by elastic training: %s" % e)
                raise failure from None
            after_reset = True
    return wrapper
