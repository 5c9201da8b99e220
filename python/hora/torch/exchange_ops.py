"""Alltoall, and the allgather of CPU tensors, on libhora's collectives whose
counts each rank gives for itself (hora_alltoall_alloc_async,
hora_allgatherv_alloc_async): libhora allocates the result once the ranks
have exchanged their counts, and the output tensor is made over that buffer
without a copy, freed when the tensor is."""
import ctypes
import math
import weakref

import torch

from hora import _lib as L
from hora.torch import mpi_ops as M

__all__ = ["alltoall", "alltoall_async"]


def _over(received, dtype, rest):
    """The tensor over what libhora handed over, and the elements from each
    rank. The buffer is freed with the last tensor that views it."""
    counts = [received.counts[j] for j in range(received.size)] if received.counts else []
    buf, total = received.buf, received.total
    received.buf = None
    M._lib.hora_received_free(ctypes.byref(received))  # the counts, now copied
    row = math.prod(rest)
    if not buf or total == 0:
        if buf:
            M._lib.hora_received_free(ctypes.byref(L.Received(buf, total, None, 0)))
        return torch.empty((0,) + rest, dtype=dtype), counts
    size = torch.empty((), dtype=dtype).element_size()
    raw = (ctypes.c_char * (total * size)).from_address(buf)
    weakref.finalize(raw, M._lib.hora_received_free, L.Received(buf, total, None, 0))
    flat = torch.frombuffer(raw, dtype=dtype)
    return flat.view((total // row if row else 0,) + rest), counts


class _Received(M._Handle):
    """An operation whose output libhora allocates."""

    __slots__ = ("received", "dtype", "rest", "device", "splits")

    def __init__(self, kind, key, keep, dtype, rest, device, splits):
        super().__init__(kind, key, None, keep, finish=self._finish)
        self.received = L.Received()
        self.dtype, self.rest, self.device, self.splits = dtype, rest, device, splits

    def _finish(self):
        if math.prod(self.rest) == 0:
            # Rows of no elements travelled as one byte each (_proxy).
            _, counts = _over(self.received, torch.uint8, (1,))
            out = torch.empty((sum(counts),) + self.rest, dtype=self.dtype)
        else:
            out, counts = _over(self.received, self.dtype, self.rest)
            counts = [c // math.prod(self.rest) for c in counts]
        if self.device.type != "cpu":
            out = out.to(self.device)
        if not self.splits:
            return out
        return out, torch.tensor(counts, dtype=torch.int32)

    def result(self):
        try:
            return M._Handle.result(self)
        finally:
            if self.rc:
                M._lib.hora_received_free(ctypes.byref(self.received))


def _proxy(src):
    """What travels for src: itself, or for rows of no elements (a dimension
    of 0 after the first), one byte per row, so the ranks learn the rows."""
    if src.dim() > 1 and math.prod(src.shape[1:]) == 0:
        return torch.zeros((src.shape[0], 1), dtype=torch.uint8)
    return src


def _options(src, ps):
    nd, dims = M._dims(src.shape)
    return L.OpOptions(ctypes.sizeof(L.OpOptions), nd, dims, ps._handle), dims


def allgatherv_async(tensor, key, ps):
    """hora.torch.allgather's path for CPU tensors: one operation, whatever
    the ranks' first dimensions."""
    rest = tuple(tensor.shape[1:])
    src = _proxy(tensor.contiguous())
    dt = M._DTYPES[src.dtype]
    opts, dims = _options(src, ps)
    h = _Received("allgather", key, (src, dims, opts), tensor.dtype, rest, tensor.device, False)
    rc = M._lib.hora_allgatherv_alloc_async(key.encode(), src.data_ptr(), src.numel(), dt,
                                            ctypes.byref(h.received), ctypes.byref(opts),
                                            ctypes.byref(h.req))
    return M._submitted(rc, h, "allgather '%s'" % key)


def _split_counts(splits, rows, n, what):
    if splits is None:
        if rows % n:
            raise ValueError("%s: the first dimension (%d) does not split equally among %d "
                             "ranks; pass splits" % (what, rows, n))
        return [rows // n] * n
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point or splits.dtype == torch.bool:
            raise ValueError("%s: splits must be a 1-dimensional tensor of integers" % what)
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise ValueError("%s: splits has %d entries, one per rank of the set (%d) is needed"
                         % (what, len(splits), n))
    if any(s < 0 for s in splits):
        raise ValueError("%s: splits must not be negative: %s" % (what, splits))
    if sum(splits) != rows:
        raise ValueError("%s: splits add up to %d, but the tensor's first dimension is %d"
                         % (what, sum(splits), rows))
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=M.global_process_set):
    """Starts sending splits[j] rows of tensor (its first dimension) to each
    rank j of process_set, in rank order, and receiving the rows the others
    send this rank; splits None splits the rows equally. synchronize() returns
    (output, received_splits)."""
    ps = M._resolve_set(process_set, "alltoall_async")
    key = M._op_name("alltoall", name, ps)
    what = "alltoall '%s'" % key
    dt = M._dtype_of(tensor, what)
    if tensor.dim() == 0:
        raise ValueError("%s: cannot alltoall a 0-dimensional tensor; give it a first "
                         "dimension (tensor.view(1))" % what)
    rows = tensor.shape[0]
    rest = tuple(tensor.shape[1:])
    row = math.prod(rest)
    n = ps.size()
    counts = _split_counts(splits, rows, n, what)
    # Device tensors are staged through host memory (libhora's alltoall
    # takes host buffers).
    src = tensor.detach().to("cpu").contiguous() if tensor.is_cuda else tensor.contiguous()
    src = _proxy(src)
    if src.dtype != tensor.dtype:
        dt, row = L.UINT8, 1
    send = (ctypes.c_size_t * n)(*[c * row for c in counts])
    opts, dims = _options(src, ps)
    h = _Received("alltoall", key, (src, send, dims, opts), tensor.dtype, rest, tensor.device,
                  True)
    rc = M._lib.hora_alltoall_alloc_async(key.encode(), src.data_ptr(), src.numel(), send, dt,
                                          ctypes.byref(h.received), ctypes.byref(opts),
                                          ctypes.byref(h.req))
    return M._submitted(rc, h, what)


class _AlltoallFunction(torch.autograd.Function):
    """Alltoall with a gradient: the gradient's rows go back where they came
    from (an alltoall with the received splits)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        out, received = M.synchronize(alltoall_async(tensor, splits, name, ps))
        ctx.ps = ps
        ctx.received = received
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received, process_set=ctx.ps)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=M.global_process_set):
    """Sends splits[j] rows of tensor to each rank j of process_set and
    returns the rows received, in rank order; with splits, also the rows
    received from each rank (an int32 tensor), as Horovod. Has a gradient."""
    ps = M._resolve_set(process_set, "alltoall")
    return _AlltoallFunction.apply(tensor, splits, name, ps)
