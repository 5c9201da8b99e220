"""Horovod's collective calls on torch tensors, run by libhora.

Each call checks its tensor (dtype, device, layout) before anything is
sent, names the operation in its kind's name space ("allreduce.x" and
"broadcast.x" never meet), submits it to libhora and returns an integer
handle; synchronize(handle) waits (with the GIL released) and returns the
output. Allgather lets the first dimension differ between ranks: a small
exchange of the ranks' first dimensions goes first, so its handle advances
in two phases (see _Allgather).

Every collective takes a process_set (a ProcessSet registered by init() or
add_process_set(); global_process_set by default): it then runs among the
set's members alone, with ranks of the set where ranks order the result
(allgather) and global ranks where the caller names one (a broadcast's
root), as Horovod's.
"""
import atexit
import bisect
import ctypes
import enum
import hashlib
import itertools
import operator
import os
import sys
import threading
import time
import warnings

import torch

from hora import _lib as L
from hora._lib import HoraInternalError

__all__ = [
    "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "cuda_built", "rocm_built",
    "ccl_built", "ddl_built", "start_timeline", "stop_timeline", "metrics", "step_stats",
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_async", "broadcast_",
    "reducescatter", "reducescatter_async", "sparse_allreduce_async",
    "broadcast_async_", "join", "barrier", "poll", "synchronize", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set",
    "HoraInternalError", "HorovodInternalError",
]

HorovodInternalError = HoraInternalError


class ReduceOp(enum.IntEnum):
    """Horovod's reduction ops (the same values as Horovod's)."""
    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum
Min, Max, Product = ReduceOp.Min, ReduceOp.Max, ReduceOp.Product

_HORA_OP = {Average: L.AVERAGE, Sum: L.SUM, Min: L.MIN, Max: L.MAX, Product: L.PRODUCT,
            Adasum: L.ADASUM}

_lib = L.load()

_DTYPES = {
    torch.uint8: L.UINT8, torch.int8: L.INT8, torch.int32: L.INT32, torch.int64: L.INT64,
    torch.float16: L.FLOAT16, torch.bfloat16: L.BFLOAT16, torch.float32: L.FLOAT32,
    torch.float64: L.FLOAT64, torch.int16: L.INT16, torch.bool: L.BOOL,
}

# ---- life cycle and ranks -------------------------------------------------------


def _is_mpi_comm(obj):
    # Looked up, not imported: importing mpi4py starts MPI, and an mpi4py
    # communicator cannot exist without the module loaded.
    MPI = sys.modules.get("mpi4py.MPI")
    return MPI is not None and isinstance(obj, MPI.Comm)


class ProcessSet:
    """Ranks of the job that run collectives among themselves, as Horovod's:
    made from a list of global ranks or an mpi4py communicator, then passed
    to init(process_sets=[...]) or add_process_set() (collective over every
    rank of the job). process_set_id is None until then, and again after
    remove_process_set() or shutdown(). There is one object per set made,
    so a set is equal only to itself."""

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.ranks = None
        self.mpi_comm = None
        self._lost_at = None  # the membership whose reset invalidated it (elastic)
        self._handle = None  # the hora_process_set while registered; None means NULL: the world
        self._unnamed = {}  # per-kind counters of unnamed operations, as _op_name keeps them
        if _is_mpi_comm(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            self.ranks = sorted(operator.index(r) for r in ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of global ranks or an mpi4py communicator, "
                             "got %r" % (ranks_or_comm,)) from None

    def size(self):
        """The number of ranks in the set; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return size() if self is global_process_set else _lib.hora_process_set_size(self._handle)

    def rank(self):
        """This rank's rank in the set (0 .. size()-1, in the order of the
        global ranks); None while the set is not registered. Raises
        ValueError on a rank outside it."""
        if self.process_set_id is None:
            return None
        if self is global_process_set:
            return rank()
        r = _lib.hora_process_set_rank(self._handle)
        if r < 0:
            raise ValueError("rank %d is not a member of process set %d"
                             % (rank(), self.process_set_id))
        return r

    def included(self):
        """Whether this rank is in the set; None while its ranks are unknown
        (a communicator's set before it is registered)."""
        if self.ranks is None:
            return None
        return rank() in self.ranks

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r, mpi_comm=%r)" % (
            self.process_set_id, self.ranks, self.mpi_comm)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_added = []  # the registered sets but the world, in the order they were made


def _resolve_set(process_set, what):
    """process_set (None: the world) checked as an argument of `what`."""
    if process_set is None or process_set is global_process_set:
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise TypeError("%s: process_set must be a hvd.ProcessSet, got %s"
                        % (what, type(process_set).__name__))
    if process_set.process_set_id is None:
        if process_set._lost_at is not None:
            raise ValueError("%s: process set of ranks %s was made before the elastic reset to "
                             "membership %d and is no longer valid: add it again (this object "
                             "or a new one) with hvd.add_process_set() after the reset, on every "
                             "rank (in a reset callback: state.register_reset_callbacks)"
                             % (what, process_set.ranks, process_set._lost_at))
        raise ValueError("%s: %r is not registered: add it with hvd.add_process_set() or "
                         "hvd.init(process_sets=[...]) (a removed set must be added again)"
                         % (what, process_set))
    return process_set


def _make_set(ps, what):
    """Makes ps's set in libhora (collective over the job) and registers it."""
    # Making a set runs world collectives that block in libhora: allgathers
    # between phases must go on first, as for join.
    _drain_staged()
    out = ctypes.c_void_p()
    if ps.mpi_comm is not None:
        if not _lib.has_mpi_comm:
            raise NotImplementedError("%s: %s has no hora_process_set_from_mpi_comm"
                                      % (what, _lib.path))
        rc = _lib.hora_process_set_from_mpi_comm(_lib.mpi_comm_handle(ps.mpi_comm),
                                                 ctypes.byref(out))
    else:
        n = len(ps.ranks)
        rc = _lib.hora_process_set_create((ctypes.c_int * n)(*ps.ranks), n, ctypes.byref(out))
    L.check(rc, what)
    ps._handle = out.value
    ps.process_set_id = _lib.hora_process_set_id(ps._handle)
    n = _lib.hora_process_set_size(ps._handle)
    ranks = (ctypes.c_int * n)()
    _lib.hora_process_set_ranks(ps._handle, ranks, n)
    ps.ranks = list(ranks)
    ps._unnamed = {}
    ps._lost_at = None
    # Horovod refuses a second set of the same ranks. Checked once libhora
    # has agreed on the ranks: every rank then finds the same, where a
    # check before would leave the ranks that passed it waiting in libhora.
    if ps.mpi_comm is None and any(o.mpi_comm is None and o.ranks == ps.ranks for o in _added):
        handle = ps._handle
        ps._handle = ps.process_set_id = None
        L.check(_lib.hora_process_set_destroy(handle), what)
        raise ValueError("%s: a process set of ranks %s exists already" % (what, ps.ranks))
    _added.append(ps)


def _forget_set(ps):
    ps.process_set_id = None
    ps._handle = None
    ps._unnamed = {}
    _added.remove(ps)


def add_process_set(process_set):
    """Registers a ProcessSet (or makes one of a list of global ranks) after
    init and returns it. Collective over every rank of the job, all passing
    the same ranks."""
    _ranked(_lib.hora_size, "add_process_set")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    elif process_set.process_set_id is not None:
        raise ValueError("add_process_set: %r is registered already" % (process_set,))
    _make_set(process_set, "hora.torch.add_process_set")
    return process_set


def remove_process_set(process_set):
    """Frees a registered set (collective over every rank of the job, each
    passing its object of that set; members first complete what is in
    flight on it). False for the world or a set not registered, as Horovod;
    True once removed."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError("remove_process_set: expected a hvd.ProcessSet, got %s"
                        % type(process_set).__name__)
    if process_set.process_set_id is None or process_set is global_process_set:
        return False
    _drain_staged()
    handle = process_set._handle
    # Forgotten first: whatever libhora answers, the object never hands a
    # handle that may be freed to it again.
    _forget_set(process_set)
    L.check(_lib.hora_process_set_destroy(handle), "hora.torch.remove_process_set")
    return True


_exit_registered = False
_homogeneous = None


def _starts_through_mpi():
    """Whether hora_init will start through MPI, as it decides: HORA_BOOTSTRAP,
    else (auto) a running MPI or an MPI launcher's variables."""
    boot = os.environ.get("HORA_BOOTSTRAP", "").strip().lower()
    if boot not in ("", "auto"):
        return boot == "mpi"
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return True
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                                         "PMIX_RANK", "MPI_LOCALNRANKS"))


def _elastic_job():
    """Whether the running job is elastic (HORA_ELASTIC=1 at start-up)."""
    return bool(_lib.has_elastic) and _lib.hora_elastic_epoch() >= 0


def _part_needs(by_mpi):
    return ("mpi4py (to make their communicator; install it)" if by_mpi else
            "MPI (a job started by an MPI launcher, and mpi4py)")


def _launched_size():
    """The job's size as the launcher tells it before MPI starts, or None."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def _world_comm(comm):
    """For init's comm: the mpi4py communicator to start on (None: the whole
    job) and the number of ranks asked for (None: any). A list of ranks is
    Horovod's: only those ranks call init."""
    if comm is None or _is_mpi_comm(comm):
        return comm, None
    try:
        ranks = sorted(operator.index(r) for r in comm)
    except TypeError:
        raise ValueError("hora.torch.init: comm must be a list of ranks or an mpi4py "
                         "communicator, got %s" % type(comm).__name__) from None
    MPI = None
    by_mpi = _starts_through_mpi()
    if by_mpi:  # else importing mpi4py would start an MPI of one process
        try:
            from mpi4py import MPI
        except ImportError:
            pass
    if MPI is None:
        n = _launched_size()
        if ranks != list(range(len(ranks))) or (n is not None and n != len(ranks)):
            raise NotImplementedError("hora.torch.init: starting on ranks %s, a part of the job, "
                                      "needs %s, or call init() on every rank and use a process "
                                      "set" % (ranks, _part_needs(by_mpi))) from None
        return None, len(ranks)
    world = MPI.COMM_WORLD
    if ranks == list(range(world.Get_size())):
        return None, len(ranks)
    # Collective over those ranks only, as Horovod's init on a list.
    return world.Create_group(world.Get_group().Incl(ranks)), None


def init(comm=None, process_sets=None):
    """Starts the runtime (collective over the job) and registers
    process_sets (a list of ProcessSet, or "dynamic": sets can always be
    added later). comm: a list of global ranks or an mpi4py communicator
    to run on instead of the whole job. A second call is harmless."""
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError("hora.torch.init: process_sets must be a list of hvd.ProcessSet or "
                             "\"dynamic\", got %r" % (process_sets,))
        process_sets = None
    process_sets = list(process_sets or ())
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            raise TypeError("hora.torch.init: process_sets must hold hvd.ProcessSet objects, got "
                            "%s" % type(ps).__name__)
    world_comm, n = _world_comm(comm)
    if world_comm is None:
        L.check(_lib.hora_init(), "hora.torch.init")
        if n is not None and n != size():
            raise NotImplementedError("hora.torch.init: comm names %d ranks and the job has %d; "
                                      "starting on a part of the job needs %s"
                                      % (n, size(), _part_needs(mpi_enabled())))
    elif not _lib.has_mpi_comm:
        raise NotImplementedError("hora.torch.init: %s has no hora_init_comm" % _lib.path)
    else:
        L.check(_lib.hora_init_comm(_lib.mpi_comm_handle(world_comm)), "hora.torch.init")
        global_process_set.mpi_comm = world_comm
    global _exit_registered
    if not _exit_registered:
        # Horovod scripts rarely call shutdown(); MPI must still be finalized.
        atexit.register(shutdown)
        _exit_registered = True
    global_process_set.ranks = list(range(size()))
    global _homogeneous
    if _homogeneous is None:
        _homogeneous = _ask_homogeneous("hora.torch.init")
    for ps in process_sets:
        if ps.process_set_id is None:  # a second init, or the same object twice
            _make_set(ps, "hora.torch.init")


def _ask_homogeneous(what):
    """Whether every host runs as many ranks, asked of every rank (Horovod's
    is_homogeneous() is local). A process joining an elastic job asks in
    init, the members it joins in _membership_changed: the same operation."""
    sizes = torch.zeros(size(), dtype=torch.int64)
    mine = torch.tensor([local_size()], dtype=torch.int64)
    req = ctypes.c_void_p()
    L.check(_lib.hora_allgather_async(b"hora.torch.init.local_sizes", mine.data_ptr(), 1,
                                      L.INT64, sizes.data_ptr(), ctypes.byref(req)), what)
    L.check(_lib.hora_wait(ctypes.byref(req)), what)
    return bool((sizes == sizes[0]).all())


def _membership_changed():
    """After hora_elastic_reset (hora.torch.elastic): drops what belonged to
    the old membership. Its requests have failed: they are waited for, which
    frees them and their buffers (an allgather between its phases is not
    advanced into the new membership). Its process sets are invalid: their
    objects are forgotten and say why when used. Unnamed operations are
    numbered from 0 again, as in a process that has just joined."""
    for i, h in list(_staged.items()):
        with h.lock:
            h._wait()
        _handles.pop(i, None)
    _staged.clear()
    for i in list(_handles):
        try:
            synchronize(i)
        except HoraInternalError:
            pass
    _handles.clear()
    epoch = _lib.hora_elastic_epoch()
    for ps in list(_added):
        _forget_set(ps)
        ps._lost_at = epoch
    _allreduce_options_cache.clear()
    global_process_set.ranks = list(range(size()))
    global_process_set._unnamed = {}
    global _homogeneous
    _homogeneous = _ask_homogeneous("hora_elastic_reset")


def shutdown():
    """Stops the runtime; blocks until every rank has called it."""
    if _lib.hora_initialized():
        # Pending requests complete or fail inside hora_finalize: their
        # buffers (held by the handles) must outlive it.
        rc = _lib.hora_finalize()
        _handles.clear()
        _staged.clear()
        for ps in list(_added):  # hora_finalize destroyed them
            _forget_set(ps)
        # After a failure of the job (already raised by the calls it failed),
        # shutting down is what is left to do: only misuse raises here.
        if rc in (L.ERR_INVALID_ARG, L.ERR_INVALID_USAGE):
            L.check(rc, "hora.torch.shutdown")


def is_initialized():
    return bool(_lib.hora_initialized())


def _ranked(f, what):
    v = f()
    if v < 0:
        raise ValueError("hora has not been initialized; use hvd.init() (asked for %s)" % what)
    return v


def size():
    return _ranked(_lib.hora_size, "size")


def rank():
    return _ranked(_lib.hora_rank, "rank")


def local_size():
    return _ranked(_lib.hora_local_size, "local_size")


def local_rank():
    return _ranked(_lib.hora_local_rank, "local_rank")


def cross_size():
    return _ranked(_lib.hora_cross_size, "cross_size")


def cross_rank():
    return _ranked(_lib.hora_cross_rank, "cross_rank")


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    _ranked(_lib.hora_size, "is_homogeneous")
    return _homogeneous


def mpi_threads_supported():
    _ranked(_lib.hora_size, "mpi_threads_supported")
    if not mpi_enabled():  # as Horovod's
        raise ValueError("hora.torch.mpi_threads_supported: MPI is not enabled (the job started "
                         "through %s)" % _lib.hora_bootstrap().decode())
    return bool(_lib.hora_mpi_threads_supported())


def mpi_enabled():
    """Whether this job started through MPI (not hora's own rendezvous,
    torchrun's variables or Slurm's)."""
    _ranked(_lib.hora_size, "mpi_enabled")
    return _lib.hora_bootstrap() == b"mpi"


def mpi_built():
    """Whether libhora was built with MPI (not configure --without-mpi)."""
    return _lib.built("mpi")


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return _lib.built("nccl")


def cuda_built():
    return _lib.built("cuda")


def rocm_built():
    return False


def ccl_built():
    return False


def ddl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome trace of every operation to file_path (rank 0
    writes it). Call it on every rank, as Horovod's."""
    L.check(_lib.hora_start_timeline(str(file_path).encode(), 1 if mark_cycles else 0),
            "hora.torch.start_timeline")


def stop_timeline():
    L.check(_lib.hora_stop_timeline(), "hora.torch.stop_timeline")


def metrics():
    """This process's counters from libhora (hora_get_stats, include/hora.h),
    as a dict of plain ints and floats keyed by the C field names: e.g.
    "operations", "allreduces", "bytes" (of the callers' buffers the
    collectives covered), "fused_batches", "negotiate_seconds". They count
    from init(), in every process set, and only grow."""
    st = L.Stats(struct_size=ctypes.sizeof(L.Stats))
    L.check(_lib.hora_get_stats(ctypes.byref(st)), "hora.torch.metrics")
    return {name: getattr(st, name) for name, _ in L.Stats._fields_ if name != "struct_size"}


def step_stats():
    """Where the steps' time went (hora_get_step_stats, include/hora.h), as a
    dict keyed by the C field names: "steps" ended so far (each
    DistributedOptimizer.step() ends one), their "seconds", "wait_seconds"
    (waiting for hora: exposed communication) and "compute_seconds", the
    "bytes" reduced, and the same for the "last_" step alone. Not in
    Horovod."""
    st = L.StepStats(struct_size=ctypes.sizeof(L.StepStats))
    L.check(_lib.hora_get_step_stats(ctypes.byref(st)), "hora.torch.step_stats")
    return {name: getattr(st, name) for name, _ in L.StepStats._fields_ if name != "struct_size"}


# ---- names and tensor checks ------------------------------------------------------

def _op_name(kind, name, ps=global_process_set):
    """Horovod's names: '<kind>.<name>', or '<kind>.noname.<n>' numbered per
    kind and process set, the same on every member that submits in the same
    order (the ranks outside a set submit nothing to it)."""
    if name is None:
        # setdefault and next() are each atomic under the GIL: the autograd
        # thread and the main thread may both be submitting.
        n = next(ps._unnamed.setdefault(kind, itertools.count()))
        return "%s.noname.%d" % (kind, n)
    key = "%s.%s" % (kind, name)
    if len(key.encode()) > 255:
        # libhora's names stop at 255 bytes; Horovod's do not.
        digest = hashlib.sha1(key.encode()).hexdigest()[:16]
        key = key.encode()[:200].decode("utf-8", "ignore") + "#" + digest
    return key


def _dtype_of(tensor, what):
    """The hora dtype of tensor, or a clear error; `what` names the operation
    (a string, or a function making one: only errors need it)."""
    if isinstance(tensor, torch.Tensor):
        dt = _DTYPES.get(tensor.dtype)
        if (dt is not None and tensor.layout == torch.strided and
                (tensor.is_cpu or (tensor.is_cuda and _lib.has_cuda))):
            return dt
    what = what() if callable(what) else what
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if _DTYPES.get(tensor.dtype) is None:
        raise ValueError("%s: tensor of dtype %s is not supported (supported: %s)"
                         % (what, tensor.dtype, ", ".join(str(d) for d in _DTYPES)))
    if tensor.layout != torch.strided:
        raise ValueError("%s: %s tensors are not supported; convert with .to_dense()"
                         % (what, tensor.layout))
    if tensor.is_cuda:
        raise ValueError("%s: the tensor is on %s but this libhora was built without CUDA"
                         % (what, tensor.device))
    raise ValueError("%s: tensors on %s are not supported (cpu and cuda are)"
                     % (what, tensor.device))


def _dims(shape):
    n = len(shape)
    if n > L.MAX_DIMS:
        return -1, None
    return n, (ctypes.c_int64 * n)(*shape)


# libhora copies options and shapes at submission, so one struct per
# (shape, prescale, postscale, set) serves every call: a training loop submits
# the same few again and again. The set is keyed by its handle, the very value
# the struct holds, so a set made later at a removed one's address is served
# right.
_allreduce_options_cache = {}


def _allreduce_options(shape, prescale, postscale, handle):
    k = (shape, prescale, postscale, handle)
    entry = _allreduce_options_cache.get(k)
    if entry is None:
        if len(_allreduce_options_cache) >= 4096:
            _allreduce_options_cache.clear()
        nd, dims = _dims(shape)
        entry = (L.AllreduceOptions(ctypes.sizeof(L.AllreduceOptions), prescale, postscale,
                                    L.COMPRESSION_DEFAULT, nd, dims, handle), dims)
        _allreduce_options_cache[k] = entry
    return entry[0]


def _stream_of(tensor):
    return ctypes.c_void_p(torch.cuda.current_stream(tensor.device).cuda_stream)


# ---- handles ---------------------------------------------------------------------


class _Handle:
    """One submitted operation: its request, what must stay alive until it
    completes, and what turns the finished buffer into the output.

    `lock` serialises test, wait, advance and result, as Horovod's handle
    manager does: libhora frees the request in the hora_test or hora_wait
    that reports it done, so two threads must never pass it at once. test()
    only tries the lock: while another thread holds it (waiting), the
    operation is not known to be complete yet."""

    __slots__ = ("req", "kind", "key", "output", "keep", "finish", "rc", "err", "stream_of",
                 "lock")

    def __init__(self, kind, key, output, keep, finish=None):
        self.req = ctypes.c_void_p()
        self.kind = kind
        self.key = key
        self.output = output
        self.keep = keep
        self.finish = finish
        self.rc = None
        self.err = ""
        self.stream_of = None  # a CUDA tensor: wait on torch's current stream
        self.lock = threading.Lock()

    @property
    def what(self):
        return "%s '%s'" % (self.kind, self.key)

    def test(self):
        """True once the request has completed (its result recorded). Never blocks."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            return self._test()
        finally:
            self.lock.release()

    def _test(self):  # with lock held
        if self.rc is not None:
            return True
        done = ctypes.c_int(0)
        rc = _lib.hora_test(ctypes.byref(self.req), ctypes.byref(done))
        if done.value or rc:  # a failed test (a CUDA event query) ends it too
            self._record(rc)
            return True
        return False

    def wait(self):
        with self.lock:
            self._wait()

    def _wait(self):  # with lock held
        if self.rc is None:
            if self.stream_of is not None:
                rc = _lib.hora_wait_stream(ctypes.byref(self.req), _stream_of(self.stream_of))
            else:
                rc = _lib.hora_wait(ctypes.byref(self.req))
            self._record(rc)

    def _record(self, rc):
        self.rc = rc
        if rc:
            self.err = _lib.last_error() or _lib.strerror(rc)

    def result(self):
        with self.lock:
            return self._result()

    def _result(self):  # with lock held
        if self.stream_of is not None:
            # Temporaries may come from another stream's pool: keep them out
            # of reuse until the stream that waited for hora is done with them.
            stream = torch.cuda.current_stream(self.stream_of.device)
            for t in (self.keep if isinstance(self.keep, tuple) else (self.keep,)):
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(stream)
        self.keep = None
        if self.rc:
            raise HoraInternalError(L.message(self.what, self.err, self.key), self.rc)
        out = self.output
        if self.finish is not None:
            out = self.finish()
        return out


_handles = {}
_staged = {}  # handle -> _Allgather still in its first phase
_next_handle = itertools.count()


def _new_handle(h):
    i = next(_next_handle)
    _handles[i] = h
    return i


def _submitted(rc, h, what):
    if rc != L.SUCCESS:
        L.check(rc, what, key=h.key)
    return _new_handle(h)


# ---- allreduce ------------------------------------------------------------------------


def _resolve_op(op, average):
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _HORA_OP:
        raise ValueError("unknown reduction op %r" % (op,))
    return op


def _allreduce_submit(tensor, output, name, op, prescale_factor, postscale_factor, in_place,
                      ps):
    key = _op_name("allreduce", name, ps)
    dt = _dtype_of(tensor, lambda: "allreduce '%s'" % key)
    src = tensor if tensor.is_contiguous() else tensor.contiguous()
    finish = None
    if in_place:
        if src is not tensor:
            def finish(t=tensor, s=src):
                t.copy_(s)
                return t
        dst = src
        h = _Handle("allreduce", key, tensor, src, finish)
    else:
        dst = output
        h = _Handle("allreduce", key, output, (src, dst))
    opts = _allreduce_options(tensor.shape, prescale_factor, postscale_factor, ps._handle)
    if tensor.is_cuda:
        h.stream_of = tensor
        with torch.cuda.device(tensor.device):
            rc = _lib.hora_allreduce_async_stream(key.encode(), src.data_ptr(), dst.data_ptr(),
                                                  tensor.numel(), dt, _HORA_OP[op],
                                                  ctypes.byref(opts), _stream_of(tensor),
                                                  ctypes.byref(h.req))
    else:
        rc = _lib.hora_allreduce_async_ex(key.encode(), src.data_ptr(), dst.data_ptr(),
                                          tensor.numel(), dt, _HORA_OP[op], ctypes.byref(opts),
                                          ctypes.byref(h.req))
    if rc:
        L.check(rc, h.what, key=key)
    i = next(_next_handle)
    _handles[i] = h
    return i


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce into a new tensor; returns a handle for synchronize()."""
    op = _resolve_op(op, average)
    ps = _resolve_set(process_set, "allreduce_async")
    _dtype_of(tensor, lambda: "allreduce '%s'" % (name or "unnamed"))  # before allocating
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_submit(tensor, output, name, op, prescale_factor, postscale_factor, False,
                             ps)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place allreduce of tensor; returns a handle."""
    op = _resolve_op(op, average)
    ps = _resolve_set(process_set, "allreduce_async_")
    return _allreduce_submit(tensor, None, name, op, prescale_factor, postscale_factor, True, ps)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Allreduces tensor in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _AllreduceFunction(torch.autograd.Function):
    """Allreduce with a gradient: the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.ps = ps
        h = allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, process_set=ps)
        return synchronize(h)

    @staticmethod
    def backward(ctx, grad_output):
        g = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                      postscale_factor=ctx.postscale_factor, process_set=ctx.ps)
        return g, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns the reduction of tensor over the ranks of process_set (a new
    tensor). Has a gradient. `compression` (Compression.fp16, ...) narrows
    the tensor for the trip and restores its dtype after."""
    from hora.torch.compression import Compression
    op = _resolve_op(op, average)
    ps = _resolve_set(process_set, "allreduce")
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFunction.apply(compressed, name, op, prescale_factor, postscale_factor, ps)
    return compression.decompress(reduced, ctx)


# ---- reducescatter --------------------------------------------------------------------


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing tensor over process_set's ranks, each keeping its
    share of the first dimension (the first rows % size ranks one row more,
    as Horovod's); returns a handle whose result is that share."""
    op = _resolve_op(op, None)
    if op == Adasum:
        raise NotImplementedError("reducescatter with op=Adasum is not supported: Adasum is an "
                                  "allreduce op")
    ps = _resolve_set(process_set, "reducescatter_async")
    key = _op_name("reducescatter", name, ps)
    what = "reducescatter '%s'" % key
    dt = _dtype_of(tensor, what)
    if tensor.dim() == 0:
        raise ValueError("%s: cannot reducescatter a 0-dimensional tensor; give it a first "
                         "dimension (tensor.view(1))" % what)
    src = tensor if tensor.is_contiguous() else tensor.contiguous()
    n, me = ps.size(), ps.rank()
    rows = tensor.shape[0]
    share = _lib.hora_reducescatter_block(rows, rows, n, me) if rows else 0
    output = torch.empty((share,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                         device=tensor.device)
    h = _Handle("reducescatter", key, output, (src, output))
    opts = _allreduce_options(tensor.shape, prescale_factor, postscale_factor, ps._handle)
    if tensor.is_cuda:
        h.stream_of = tensor
        with torch.cuda.device(tensor.device):
            rc = _lib.hora_reducescatter_async_stream(key.encode(), src.data_ptr(),
                                                      output.data_ptr(), tensor.numel(), dt,
                                                      _HORA_OP[op], ctypes.byref(opts),
                                                      _stream_of(tensor), ctypes.byref(h.req))
    else:
        rc = _lib.hora_reducescatter_async_ex(key.encode(), src.data_ptr(), output.data_ptr(),
                                              tensor.numel(), dt, _HORA_OP[op],
                                              ctypes.byref(opts), ctypes.byref(h.req))
    return _submitted(rc, h, what)


class _ReducescatterFunction(torch.autograd.Function):
    """Reducescatter with Horovod's gradient: the output gradient times the
    set's size for Sum (1 for the other ops), times the pre- and postscale
    factors, allgathered. For Average that is size times the plain
    derivative (see the manual's PyTorch page, Differences from Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, ps):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, ps)
        ctx.ps = ps
        return synchronize(reducescatter_async(tensor, name, op, ps, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output.contiguous()
        if ctx.scale != 1.0:
            grad = grad * ctx.scale
        return allgather(grad, process_set=ctx.ps), None, None, None, None, None


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, ps):
    """What Horovod's reducescatter backward multiplies the gradient by."""
    scale = float(ps.size()) if op == Sum else 1.0
    return scale * prescale_factor * postscale_factor


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share of the reduction of tensor over
    process_set's ranks (a new tensor). Has a gradient."""
    from hora.torch.compression import Compression
    ps = _resolve_set(process_set, "reducescatter")
    compression = compression or Compression.none
    compressed, cctx = compression.compress(tensor)
    out = _ReducescatterFunction.apply(compressed, name, _resolve_op(op, None), prescale_factor,
                                       postscale_factor, ps)
    return compression.decompress(out, cctx)


# ---- sparse allreduce -----------------------------------------------------------------


class _SparseHandle:
    """The handle of sparse_allreduce_async: call it (as Horovod's) or pass
    it to synchronize() for the reduced sparse tensor."""

    __slots__ = ("tensor", "indices", "values", "op", "size", "result")

    def __init__(self, tensor, indices, values, op, size):
        self.tensor, self.indices, self.values = tensor, indices, values
        self.op, self.size = op, size
        self.result = None

    def __call__(self):
        if self.result is None:
            values = synchronize(self.values)
            indices = synchronize(self.indices)
            if self.op == Average:
                values = values / self.size
            t = self.tensor
            self.result = torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                                  dtype=values.dtype).coalesce()
        return self.result

    def poll(self):
        return self.result is not None or (poll(self.values) and poll(self.indices))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor over process_set's ranks as
    Horovod does: every rank's indices and values are allgathered (the same
    index from several ranks adds up). Returns a handle; calling it, or
    synchronize(handle), gives the reduced sparse tensor, coalesced
    (averaged over the set's size for Average). op is Sum or Average."""
    ps = _resolve_set(process_set, "sparse_allreduce_async")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async: expected a sparse COO tensor, got %s"
                         % (tensor.layout if isinstance(tensor, torch.Tensor)
                            else type(tensor).__name__))
    op = _resolve_op(op, None)
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async: op must be Sum or Average, got %r" % (op,))
    t = tensor.coalesce()
    # Allgather concatenates along the first dimension: the indices go
    # transposed, one row per nonzero.
    ih = allgather_async(t._indices().transpose(0, 1).contiguous(), name="%s.indices" % name,
                         process_set=ps)
    vh = allgather_async(t._values().contiguous(), name="%s.values" % name, process_set=ps)
    return _SparseHandle(t, ih, vh, op, ps.size())


# ---- allgather ------------------------------------------------------------------------


class _Allgather(_Handle):
    """An allgather of CUDA tensors whose ranks may differ in the first
    dimension (libhora's allgatherv takes host buffers). Phase one
    allgathers every rank's first dimension; phase two allgathers the data,
    padded to the largest first dimension where they differ, and the output
    is cut from it. The second phase is submitted as soon as the first is
    seen complete, by any later call of this module, so no rank waits on a
    phase another rank has not submitted."""

    __slots__ = ("tensor", "sizes", "phase", "set_handle")

    def __init__(self, tensor, key, ps):
        super().__init__("allgather", key, None, None)
        self.tensor = tensor
        self.sizes = torch.empty(ps.size(), dtype=torch.int64)  # one per member
        self.phase = 1
        self.set_handle = ps._handle  # both phases run in the set

    def submit_sizes(self):
        first = torch.tensor([self.tensor.shape[0]], dtype=torch.int64)
        opts = L.OpOptions(ctypes.sizeof(L.OpOptions), -1, None, self.set_handle)
        self.keep = (first, self.sizes)
        return _lib.hora_allgather_async_ex((self.key + "#sizes").encode(), first.data_ptr(), 1,
                                            L.INT64, self.sizes.data_ptr(), ctypes.byref(opts),
                                            ctypes.byref(self.req))

    def advance(self):
        """Submits phase two once phase one is done. True when no longer
        staged; False also while another thread holds the handle."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            return self._advance()
        finally:
            self.lock.release()

    def _advance(self):  # with lock held
        if self.phase != 1:
            return True  # another thread advanced it
        if not _Handle._test(self):
            return False
        if self.rc:
            return True
        self.rc = None
        self.phase = 2
        t = self.tensor
        sizes = self.sizes.tolist()
        most = max(sizes)
        rest = tuple(t.shape[1:])
        dt = _DTYPES[t.dtype]
        src = t if t.is_contiguous() else t.contiguous()
        if t.shape[0] < most:
            pad = torch.zeros((most - t.shape[0],) + rest, dtype=t.dtype, device=t.device)
            src = torch.cat([src, pad])
        gathered = torch.empty((most * len(sizes),) + rest, dtype=t.dtype, device=t.device)
        if all(s == most for s in sizes):
            self.output = gathered
        else:
            def finish(g=gathered, s=sizes, m=most):
                return torch.cat([g.narrow(0, r * m, n) for r, n in enumerate(s)])
            self.finish = finish
        nd, dims = _dims(src.shape)
        opts = L.OpOptions(ctypes.sizeof(L.OpOptions), nd, dims, self.set_handle)
        self.keep = (src, gathered, dims, opts)
        self.req = ctypes.c_void_p()
        key = self.key.encode()
        if t.is_cuda:
            self.stream_of = t
            with torch.cuda.device(t.device):
                rc = _lib.hora_allgather_async_stream_ex(key, src.data_ptr(), src.numel(), dt,
                                                         gathered.data_ptr(),
                                                         ctypes.byref(opts), _stream_of(t),
                                                         ctypes.byref(self.req))
        else:
            rc = _lib.hora_allgather_async_ex(key, src.data_ptr(), src.numel(), dt,
                                              gathered.data_ptr(), ctypes.byref(opts),
                                              ctypes.byref(self.req))
        if rc:
            self._record(rc)
        return True

    def _test(self):
        if self.phase == 1:
            return False
        return _Handle._test(self)


def _advance_staged():
    for i, h in list(_staged.items()):
        if h.advance():
            _staged.pop(i, None)  # another thread may have taken it


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts gathering the tensors of process_set's ranks along the first
    dimension, in the order of their ranks; their first dimensions may
    differ. Returns a handle."""
    ps = _resolve_set(process_set, "allgather_async")
    key = _op_name("allgather", name, ps)
    what = "allgather '%s'" % key
    _dtype_of(tensor, what)
    if tensor.dim() == 0:
        raise ValueError("%s: cannot allgather a 0-dimensional tensor; give it a first "
                         "dimension (tensor.view(1))" % what)
    if not tensor.is_cuda:
        # One native operation (hora_allgatherv_alloc_async).
        from hora.torch.exchange_ops import allgatherv_async
        return allgatherv_async(tensor, key, ps)
    h = _Allgather(tensor, key, ps)
    rc = h.submit_sizes()
    i = _submitted(rc, h, what)
    _staged[i] = h
    return i


class _AllgatherFunction(torch.autograd.Function):
    """Allgather with a gradient, as Horovod's: each rank gets the average
    over the set's ranks of the gradient's rows that came from it."""

    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.dim = tensor.shape[0]
        ctx.ps = ps
        return synchronize(allgather_async(tensor, name=name, process_set=ps))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, op=Average, process_set=ctx.ps)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.ps)
        r = ctx.ps.rank()
        offset = int(dims[:r].sum()) if r else 0
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates the tensors of process_set's ranks along the first
    dimension, in the order of their ranks (a new tensor). Has a gradient."""
    ps = _resolve_set(process_set, "allgather")
    return _AllgatherFunction.apply(tensor, name, ps)


# ---- broadcast ------------------------------------------------------------------------


def _broadcast_submit(tensor, root_rank, name, in_place, ps):
    key = _op_name("broadcast", name, ps)
    what = "broadcast '%s'" % key
    dt = _dtype_of(tensor, what)
    try:
        root_rank = operator.index(root_rank)
    except TypeError:
        raise TypeError("%s: root_rank must be an integer, got %s"
                        % (what, type(root_rank).__name__)) from None
    root = root_rank
    if ps._handle is not None:
        # Horovod's root is a global rank; libhora's, a rank of the set.
        i = bisect.bisect_left(ps.ranks, root_rank)
        if i == len(ps.ranks) or ps.ranks[i] != root_rank:
            raise ValueError("%s: root_rank %d is not a member of process set %d (ranks %s)"
                             % (what, root_rank, ps.process_set_id, ps.ranks))
        root = i
    if in_place:
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        finish = None
        if buf is not tensor:
            def finish(t=tensor, b=buf):
                t.copy_(b)
                return t
        out = tensor
    else:
        buf = tensor.clone(memory_format=torch.contiguous_format)
        finish, out = None, buf
    nd, dims = _dims(tensor.shape)
    opts = L.OpOptions(ctypes.sizeof(L.OpOptions), nd, dims, ps._handle)
    h = _Handle("broadcast", key, out, (buf, dims, opts), finish)
    kb = key.encode()
    if tensor.is_cuda:
        h.stream_of = tensor
        with torch.cuda.device(tensor.device):
            rc = _lib.hora_broadcast_async_stream_ex(kb, buf.data_ptr(), buf.numel(), dt,
                                                     root, ctypes.byref(opts),
                                                     _stream_of(tensor), ctypes.byref(h.req))
    else:
        rc = _lib.hora_broadcast_async_ex(kb, buf.data_ptr(), buf.numel(), dt, root,
                                          ctypes.byref(opts), ctypes.byref(h.req))
    return _submitted(rc, h, what)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's tensor into a new tensor; returns a
    handle. root_rank is a global rank, a member of process_set."""
    ps = _resolve_set(process_set, "broadcast_async")
    return _broadcast_submit(tensor, root_rank, name, False, ps)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's tensor into tensor; returns a handle."""
    ps = _resolve_set(process_set, "broadcast_async_")
    return _broadcast_submit(tensor, root_rank, name, True, ps)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites tensor with root_rank's and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFunction(torch.autograd.Function):
    """Broadcast with a gradient, as Horovod's: the root gets the average of
    every member's gradient, the others zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.root_rank = root_rank
        ctx.ps = ps
        return synchronize(broadcast_async(tensor, root_rank, name=name, process_set=ps))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, op=Average, process_set=ctx.ps)
        if rank() != ctx.root_rank:  # both global ranks
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank of process_set (a new
    tensor); root_rank is a global rank. Has a gradient."""
    ps = _resolve_set(process_set, "broadcast")
    return _BroadcastFunction.apply(tensor, root_rank, name, ps)


# ---- completion ------------------------------------------------------------------------


def poll(handle):
    """True when the operation of handle has completed (never blocks)."""
    if isinstance(handle, _SparseHandle):
        return handle.poll()
    h = _handles.get(handle)
    if h is None:
        raise ValueError("poll: unknown handle %r" % (handle,))
    if _staged:
        _advance_staged()
    return h.test()


def synchronize(handle):
    """Waits for the operation of handle and returns its output tensor.
    Raises HoraInternalError when it failed."""
    if isinstance(handle, _SparseHandle):
        return handle()
    h = _handles.pop(handle, None)
    if h is None:
        return None  # as Horovod: an unknown or already synchronized handle
    try:
        if _staged:
            _wait_staged(handle, h)
            _staged.pop(handle, None)
        h.wait()
    except BaseException:
        # Interrupted: libhora may still write into the buffers h keeps alive.
        _handles[handle] = h
        raise
    return h.result()


def _wait_staged(handle, h):
    """Waits while allgathers are between phases: their second phases must
    go out while this rank waits, or a rank waiting on one of them would
    wait for ever. Polls with a backoff up to 1 ms; the GIL is free while
    it sleeps."""
    if len(_staged) == 1 and handle in _staged:
        with h.lock:  # (advance must not give up to another thread here)
            h._wait()  # phase one, blocking: nothing else needs advancing
            h._advance()
        _staged.pop(handle, None)
        return
    delay = 2e-5
    while True:
        _advance_staged()
        if handle not in _staged and h.test():
            return
        if not _staged:
            return  # h.wait() blocks from here
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)


def join(device=-1):
    """For a rank out of data: takes part in the others' allreduces with
    zeros until every rank has joined. Returns the rank that joined last."""
    _drain_staged()
    last = ctypes.c_int(-1)
    L.check(_lib.hora_join(ctypes.byref(last)), "hora.torch.join", ())
    return last.value


def _drain_staged():
    """Sends the second phase of every allgather between phases before a
    call that blocks in libhora (join), polling as synchronize does."""
    delay = 2e-5
    while _staged:
        _advance_staged()
        if _staged:
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)


def barrier(process_set=global_process_set):
    """Returns when every rank of process_set has called it."""
    ps = _resolve_set(process_set, "barrier")
    # An allreduce of nothing: it completes once every member has submitted
    # it, and its wait lets allgathers between phases go on, where a
    # blocking hora_barrier_ex would hold back phases other ranks wait on.
    h = allreduce_async_(torch.zeros(0), name=_op_name("barrier", None, ps), op=Sum,
                         process_set=ps)
    synchronize(h)
