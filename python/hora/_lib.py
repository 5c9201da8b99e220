"""Loads libhora through ctypes and declares the C calls the bindings use.

Nothing here imports a framework: hora.torch (and any later binding) builds
on these prototypes. ctypes releases the GIL around every foreign call, so a
blocking hora_wait or hora_join lets other Python threads run.
"""
import ctypes
import ctypes.util
import os

__all__ = ["HoraError", "HoraInternalError", "HoraValueError", "HoraLoadError", "load", "check"]


class HoraLoadError(ImportError):
    """libhora could not be found or loaded."""


class HoraError(RuntimeError):
    """Base of the errors raised for hora's result codes."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class HoraInternalError(HoraError):
    """A collective failed while running: a peer was lost, ranks disagreed
    about an operation, the job was aborted. Carries hora_last_error()."""


class HoraValueError(HoraInternalError, ValueError):
    """Bad arguments or usage found at submission (a name already in flight,
    a bad root). A ValueError, and a HoraInternalError as Horovod's callers
    catch it."""


# Result codes, in the order of HORA_RESULT_MAP in hora.h (ABI). These values
# and the structs below copy include/hora.h; tests/python/test_abi.py checks them.
SUCCESS = 0
ERR_INVALID_ARG = 1
ERR_INVALID_USAGE = 2
ERR_MISMATCH = 3
ERR_NO_MEMORY = 4
ERR_SYSTEM = 5
ERR_PEER_LOST = 6
ERR_TIMEOUT = 7
ERR_ABORTED = 8
ERR_NOT_SUPPORTED = 9
ERR_CORRUPT = 10
ERR_PROTOCOL = 11

# hora_dtype values (ABI).
UINT8, INT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, INT16, BOOL = range(10)
# hora_op values (ABI).
SUM, AVERAGE, MIN, MAX, PRODUCT, ADASUM = range(6)
# hora_compression values (ABI).
COMPRESSION_DEFAULT, COMPRESSION_NONE, COMPRESSION_FP16, COMPRESSION_BF16 = -1, 0, 1, 2

MAX_DIMS = 32


class AllreduceOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("compression", ctypes.c_int),
        ("ndims", ctypes.c_int),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
        ("process_set", ctypes.c_void_p),  # a hora_process_set *; NULL: the world
    ]


class OpOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("ndims", ctypes.c_int),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
        ("process_set", ctypes.c_void_p),
    ]


class Received(ctypes.Structure):
    """hora_received: what an _alloc operation hands over."""
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("total", ctypes.c_size_t),
        ("counts", ctypes.POINTER(ctypes.c_size_t)),
        ("size", ctypes.c_int),
    ]


_U64, _F64 = ctypes.c_uint64, ctypes.c_double


class Stats(ctypes.Structure):
    """hora_stats: the runtime's counters (hora_get_stats fills what our
    struct_size covers, so a newer libhora's added fields are left out)."""
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (n, _U64) for n in ("operations", "allreduces", "broadcasts", "allgathers", "bytes",
                            "fused_batches", "fused_tensors", "cache_hits", "cache_misses")
    ] + [(n, _F64) for n in ("negotiate_seconds", "communicate_seconds", "copy_seconds")] + [
        (n, _U64) for n in ("direct_bytes", "cycles", "sent_in_full", "kernel_bytes",
                            "staged_bytes", "reducescatters", "alltoalls", "staged_operations")
    ] + [(n, _F64) for n in ("stage_submit_seconds", "stage_handoff_seconds",
                             "stage_negotiate_seconds", "stage_run_seconds",
                             "stage_complete_seconds", "stage_wake_seconds")] + [
        ("eager_allreduces", _U64), ("bus_bytes", _U64), ("eager_collectives", _U64)]


class StepStats(ctypes.Structure):
    """hora_step_stats: where the marked steps' time went (hora_get_step_stats)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("steps", _U64)] + [
        (n, _F64) for n in ("seconds", "wait_seconds", "compute_seconds")] + [
        ("bytes", _U64)] + [(n, _F64) for n in ("communicate_seconds", "bus_bytes", "last_seconds",
                                                 "last_wait_seconds", "last_compute_seconds")] + [
        ("last_bytes", _U64), ("last_bus_bandwidth", _F64)]


class Library:
    """The loaded library, its path and which optional calls it has."""

    def __init__(self, cdll, path):
        self.cdll = cdll
        self.path = path
        P = ctypes.c_void_p
        req_p = ctypes.POINTER(ctypes.c_void_p)
        sz, i, ch = ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p
        self._proto("hora_init", i, [])
        self._proto("hora_finalize", i, [])
        self._proto("hora_initialized", i, [])
        self._proto("hora_bootstrap", ctypes.c_char_p, [])
        self._proto("hora_abort", i, [ch])
        for f in ("hora_rank", "hora_size", "hora_local_rank", "hora_local_size",
                  "hora_cross_rank", "hora_cross_size"):
            self._proto(f, i, [])
        self._proto("hora_strerror", ch, [i])
        self._proto("hora_last_error", ch, [])
        self._proto("hora_version", ch, [])
        self._proto("hora_dtype_size", sz, [i])
        self._proto("hora_allreduce_async_ex", i,
                    [ch, P, P, sz, i, i, ctypes.POINTER(AllreduceOptions), req_p])
        self._proto("hora_reducescatter_async_ex", i,
                    [ch, P, P, sz, i, i, ctypes.POINTER(AllreduceOptions), req_p])
        self._proto("hora_reducescatter_block", sz, [sz, sz, i, i])
        self._proto("hora_broadcast_async", i, [ch, P, sz, i, i, req_p])
        self._proto("hora_allgather_async", i, [ch, P, sz, i, P, req_p])
        self._proto("hora_wait", i, [req_p])
        self._proto("hora_test", i, [req_p, ctypes.POINTER(ctypes.c_int)])
        self._proto("hora_barrier", i, [])
        self._proto("hora_step_mark", i, [])
        self._proto("hora_get_step_stats", i, [ctypes.POINTER(StepStats)])
        self._proto("hora_join", i, [ctypes.POINTER(ctypes.c_int)])
        self._proto("hora_broadcast_async_ex", i,
                    [ch, P, sz, i, i, ctypes.POINTER(OpOptions), req_p])
        self._proto("hora_allgather_async_ex", i,
                    [ch, P, sz, i, P, ctypes.POINTER(OpOptions), req_p])
        szp = ctypes.POINTER(ctypes.c_size_t)
        recv_p = ctypes.POINTER(Received)
        self._proto("hora_allgatherv_alloc_async", i,
                    [ch, P, sz, i, recv_p, ctypes.POINTER(OpOptions), req_p])
        self._proto("hora_alltoall_alloc_async", i,
                    [ch, P, sz, szp, i, recv_p, ctypes.POINTER(OpOptions), req_p])
        self._proto("hora_received_free", None, [recv_p])
        self._proto("hora_group_start", i, [])
        self._proto("hora_group_end", i, [])
        self._proto("hora_process_set_create", i, [ctypes.POINTER(i), i, req_p])
        self._proto("hora_process_set_destroy", i, [P])
        self._proto("hora_process_set_world", P, [])
        for f in ("hora_process_set_id", "hora_process_set_size", "hora_process_set_rank",
                  "hora_process_set_included"):
            self._proto(f, i, [P])
        self._proto("hora_process_set_ranks", i, [P, ctypes.POINTER(i), i])
        self._proto("hora_barrier_ex", i, [ctypes.POINTER(OpOptions)])
        self._proto("hora_join_ex", i, [ctypes.POINTER(OpOptions), ctypes.POINTER(i)])
        # An MPI_Comm is a pointer in Open MPI and an int in MPICH: the caller
        # passes a ctypes value of the right type (see mpi_comm_handle).
        self.has_mpi_comm = self._proto("hora_init_comm", i, None, optional=True)
        self._proto("hora_process_set_from_mpi_comm", i, None, optional=True)
        # Elastic training: optional, so that a libhora from before it still loads
        # (hora.torch.elastic then says what is missing when used).
        self.has_elastic = self._proto("hora_elastic_reset", i, [], optional=True)
        self._proto("hora_elastic_commit", i, [ctypes.POINTER(i)], optional=True)
        self._proto("hora_elastic_joined", i, [], optional=True)
        self._proto("hora_elastic_epoch", i, [], optional=True)
        self._proto("hora_get_stats", i, [ctypes.POINTER(Stats)])
        self._proto("hora_start_timeline", i, [ch, i])
        self._proto("hora_stop_timeline", i, [])
        self._proto("hora_built", i, [ch])
        self._proto("hora_mpi_threads_supported", i, [])
        # Only builds with CUDA have the stream-ordered calls.
        self.has_cuda = self._proto("hora_allreduce_async_stream", i,
                                    [ch, P, P, sz, i, i, ctypes.POINTER(AllreduceOptions), P,
                                     req_p], optional=True)
        self._proto("hora_broadcast_async_stream_ex", i,
                    [ch, P, sz, i, i, ctypes.POINTER(OpOptions), P, req_p], optional=True)
        self._proto("hora_allgather_async_stream_ex", i,
                    [ch, P, sz, i, P, ctypes.POINTER(OpOptions), P, req_p], optional=True)
        self._proto("hora_reducescatter_async_stream", i,
                    [ch, P, P, sz, i, i, ctypes.POINTER(AllreduceOptions), P, req_p],
                    optional=True)
        self._proto("hora_wait_stream", i, [req_p, P], optional=True)

    def _proto(self, name, restype, argtypes, optional=False):
        try:
            f = getattr(self.cdll, name)
        except AttributeError:
            if optional:
                setattr(self, name, None)
                return False
            raise HoraLoadError("%s has no symbol %s: it is not the libhora this package "
                                "belongs to" % (self.path, name))
        f.restype = restype
        f.argtypes = argtypes
        setattr(self, name, f)
        return True

    @staticmethod
    def mpi_comm_handle(comm):
        """The MPI_Comm of an mpi4py communicator, as a ctypes value."""
        from mpi4py import MPI
        small = MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int)
        return (ctypes.c_int if small else ctypes.c_void_p)(MPI._handleof(comm))

    def last_error(self):
        msg = self.hora_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def strerror(self, rc):
        return self.hora_strerror(rc).decode()

    def built(self, feature):
        return bool(self.hora_built(feature.encode()))


def _candidates():
    """(path, why) pairs in the order they are tried."""
    out = []
    env = os.environ.get("HORA_LIBRARY")
    if env:
        out.append((env, "HORA_LIBRARY"))
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from hora import _installed  # written by `make install`
        out.append((os.path.join(_installed.LIBDIR, "libhora.so.0"), "the install's libdir"))
    except ImportError:
        pass
    # The build tree: python/hora/ sits two levels below the top build folder.
    top = os.path.dirname(os.path.dirname(here))
    out.append((os.path.join(top, ".libs", "libhora.so.0"), "the build tree"))
    found = ctypes.util.find_library("hora")
    out.append((found or "libhora.so.0", "the system's library path"))
    return out


_lib = None


def load():
    """The Library, loaded on first use."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path, why in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (%s): no such file" % (path, why))
            continue
        try:
            cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, why, e))
            continue
        _lib = Library(cdll, path)
        return _lib
    raise HoraLoadError("cannot load libhora; tried:\n  " + "\n  ".join(tried) +
                        "\nBuild it (make), install it (make install), or set HORA_LIBRARY to "
                        "the path of libhora.so.")


def message(what, detail, key=None):
    """`what: detail`, or the detail alone where it names the operation already."""
    if key and key in detail:
        return detail
    return "%s: %s" % (what, detail)


def check(rc, what, value_errors=(ERR_INVALID_ARG, ERR_INVALID_USAGE), key=None):
    """Raises for a failed call: ValueError for bad arguments or usage found
    at submission, HoraInternalError for the rest."""
    if rc == SUCCESS:
        return
    lib = load()
    msg = message(what, lib.last_error() or lib.strerror(rc), key)
    if rc in value_errors:
        raise HoraValueError(msg, rc)
    raise HoraInternalError(msg, rc)
