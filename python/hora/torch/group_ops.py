"""Horovod's grouped collectives on libhora's groups (hora_group_start /
hora_group_end): the tensors of one call are negotiated as one unit, sent
together and fused where they fit, and if one fails, all fail."""
import threading

import torch

from hora import _lib as L
from hora.torch import mpi_ops as M
from hora.torch.compression import Compression

__all__ = ["grouped_allreduce", "grouped_allreduce_async", "grouped_allreduce_",
           "grouped_allreduce_async_", "grouped_allgather", "grouped_allgather_async",
           "grouped_reducescatter", "grouped_reducescatter_async"]


class _GroupHandle:
    """The handles of a group's members; its result is the list of theirs.
    `lock` serialises test, wait and result as a single handle's does."""

    __slots__ = ("members", "results", "error", "lock")

    def __init__(self, members):
        self.members = members
        self.results = None
        self.error = None
        self.lock = threading.Lock()

    def test(self):
        if not self.lock.acquire(blocking=False):
            return False  # another thread is waiting on the members
        try:
            if self.results is not None or self.error is not None:
                return True
            return all(M.poll(h) for h in self.members if h in M._handles)
        finally:
            self.lock.release()

    def wait(self):
        with self.lock:
            if self.results is not None or self.error is not None:
                return
            out = []
            for h in self.members:
                try:
                    out.append(M.synchronize(h))
                except M.HoraInternalError as e:
                    # Synchronize the rest too (they fail with the group), then raise.
                    self.error = self.error or e
            if self.error is None:
                self.results = out

    def result(self):
        with self.lock:
            if self.error is not None:
                raise self.error
            return self.results


def _grouped(what, tensors, submit):
    """Submits submit(i, tensor) for every tensor inside one group."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError("%s: expected a non-empty list of tensors" % what)
    members = []
    L.check(M._lib.hora_group_start(), what)
    try:
        for i, t in enumerate(tensors):
            members.append(submit(i, t))
    finally:
        rc = M._lib.hora_group_end()
    L.check(rc, what)
    return M._new_handle(_GroupHandle(members))


def _member_name(name, i):
    return None if name is None else "%s.%d" % (name, i)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=M.global_process_set):
    """Starts allreducing every tensor of the list as one unit; synchronize()
    returns the list of results."""
    return _grouped("grouped_allreduce", tensors, lambda i, t: M.allreduce_async(
        t, average=average, name=_member_name(name, i), op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set))


class _GroupedAllreduceFunction(torch.autograd.Function):
    """Grouped allreduce with a gradient: the gradients are allreduced the
    same way, as one group."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, ps)
        return tuple(M.synchronize(grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=ps)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        out = M.synchronize(grouped_allreduce_async(
            [g.contiguous() for g in grads], op=op, prescale_factor=pre, postscale_factor=post,
            process_set=ps))
        return (None, None, None, None, None) + tuple(out)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=M.global_process_set):
    """Allreduces every tensor of the list as one unit; returns new tensors.
    Has a gradient."""
    compression = compression or Compression.none
    op = M._resolve_op(op, average)
    packed = [compression.compress(t) for t in tensors]
    if not packed:
        raise ValueError("grouped_allreduce: expected a non-empty list of tensors")
    out = _GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor,
                                          process_set, *[p for p, _ in packed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, packed)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=M.global_process_set):
    """In place: each tensor receives its result."""
    return _grouped("grouped_allreduce_", tensors, lambda i, t: M.allreduce_async_(
        t, average=average, name=_member_name(name, i), op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=M.global_process_set):
    return M.synchronize(grouped_allreduce_async_(
        tensors, average=average, name=name, op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set))


def grouped_allgather_async(tensors, name=None, process_set=M.global_process_set):
    return _grouped("grouped_allgather", tensors, lambda i, t: M.allgather_async(
        t, name=_member_name(name, i), process_set=process_set))


class _GroupedAllgatherFunction(torch.autograd.Function):
    """Grouped allgather with Horovod's gradient, as the single form's: each
    rank gets the average over the set's ranks of the gradient's rows that
    came from it."""

    @staticmethod
    def forward(ctx, name, ps, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.ps = ps
        return tuple(M.synchronize(grouped_allgather_async(list(tensors), name=name,
                                                           process_set=ps)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = M.synchronize(grouped_allreduce_async(
            [g.contiguous() for g in grads], op=M.Average, process_set=ctx.ps))
        dims = M.synchronize(grouped_allgather_async(
            [torch.tensor([d], dtype=torch.int64) for d in ctx.dims], process_set=ctx.ps))
        r = ctx.ps.rank()
        out = [g.narrow(0, int(d[:r].sum()) if r else 0, mine)
               for g, d, mine in zip(reduced, dims, ctx.dims)]
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=M.global_process_set):
    """Allgathers every tensor of the list as one unit (first dimensions may
    differ by rank); returns the list of results. Has a gradient."""
    ps = M._resolve_set(process_set, "grouped_allgather")
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError("grouped_allgather: expected a non-empty list of tensors")
    return list(_GroupedAllgatherFunction.apply(name, ps, *tensors))


def grouped_reducescatter_async(tensors, name=None, op=M.Average,
                                process_set=M.global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    return _grouped("grouped_reducescatter", tensors, lambda i, t: M.reducescatter_async(
        t, name=_member_name(name, i), op=op, process_set=process_set,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor))


class _GroupedReducescatterFunction(torch.autograd.Function):
    """Grouped reducescatter with Horovod's gradient, as the single form's:
    each output gradient times the set's size for Sum, times the scale
    factors, allgathered as one group."""

    @staticmethod
    def forward(ctx, name, op, ps, prescale_factor, postscale_factor, *tensors):
        ctx.scale = M._reducescatter_grad_scale(op, prescale_factor, postscale_factor, ps)
        ctx.ps = ps
        return tuple(M.synchronize(grouped_reducescatter_async(
            list(tensors), name=name, op=op, process_set=ps, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        grads = [g.contiguous() * ctx.scale if ctx.scale != 1.0 else g.contiguous()
                 for g in grads]
        out = M.synchronize(grouped_allgather_async(grads, process_set=ctx.ps))
        return (None, None, None, None, None) + tuple(out)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=M.Average,
                          process_set=M.global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters every tensor of the list as one unit; returns this
    rank's shares. `compression` narrows the tensors for the trip. Has a
    gradient."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError("grouped_reducescatter: expected a non-empty list of tensors")
    ps = M._resolve_set(process_set, "grouped_reducescatter")
    op = M._resolve_op(op, None)
    compression = compression or Compression.none
    packed = [compression.compress(t) for t in tensors]
    out = _GroupedReducescatterFunction.apply(name, op, ps, prescale_factor, postscale_factor,
                                              *[p for p, _ in packed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, packed)]
