"""Broadcasting model and optimizer state, and Python objects."""
import io
import pickle

try:  # Horovod pickles with cloudpickle: lambdas and local classes work too
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle

import torch

from hora.torch.mpi_ops import (_resolve_set, allgather, broadcast_, broadcast_async_,
                                global_process_set, rank, synchronize)

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every tensor of params with root_rank's (a global rank) on
    the ranks of process_set. params is a state_dict, or a list of (name,
    tensor) pairs (model.named_parameters()) or of tensors."""
    ps = _resolve_set(process_set, "broadcast_parameters")
    if isinstance(params, dict):
        params = sorted(params.items(), key=lambda kv: kv[0])
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in params:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is a %s, not a tensor"
                             % (name, type(p).__name__))
        # In place, under the autograd engine's radar (parameters are leaves).
        handles.append(broadcast_async_(p.data if p.requires_grad else p, root_rank, name, ps))
    for h in handles:
        synchronize(h)


def _walk(obj, leaf):
    """obj rebuilt with leaf(v) for every value that is not a dict, list or tuple."""
    if isinstance(obj, dict):
        return {k: _walk(v, leaf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_walk(v, leaf) for v in obj)
    return leaf(obj)


def _split_tensors(obj, tensors):
    """obj with every tensor replaced by a _TensorSlot; the tensors go to the list."""
    def leaf(v):
        if not isinstance(v, torch.Tensor):
            return v
        tensors.append(v)
        return _TensorSlot(len(tensors) - 1, tuple(v.shape), v.dtype, v.device.type)
    return _walk(obj, leaf)


def _fill_tensors(obj, tensors):
    return _walk(obj, lambda v: tensors[v.index] if isinstance(v, _TensorSlot) else v)


class _TensorSlot:
    def __init__(self, index, shape, dtype, device_type="cpu"):
        self.index, self.shape, self.dtype = index, shape, dtype
        self.device_type = device_type  # torch keeps some state (Adam's step) on the CPU


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=None):
    """Gives every rank root_rank's optimizer state: hyperparameters of every
    parameter group and the per-parameter state (momentum, Adam moments,
    step counts), on the ranks of process_set. Ranks whose state is still
    empty get it all. Where this rank's state is empty, it is first made
    by a step on zero gradients, as Horovod makes it (the parameters that
    require grad keep a zero .grad); `model` names sparse embeddings for
    that step."""
    ps = _resolve_set(process_set, "broadcast_optimizer_state")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = optimizer.state_dict()
    if not state["state"]:
        _initialize_state(optimizer, model)
        state = optimizer.state_dict()
    tensors = []
    skeleton = _split_tensors(state, tensors)
    # The structure (with the scalars) travels as one object; the tensors as
    # tensors, in place where this rank has the same ones.
    skeleton = broadcast_object(skeleton if rank() == root_rank else None, root_rank,
                                name="optimizer_state.structure", process_set=ps)
    slots = []
    _collect_slots(skeleton, slots)
    slots.sort(key=lambda s: s.index)
    device = _device_of(optimizer)
    local = {}
    if len(tensors) == len(slots):
        local = {s.index: t for s, t in zip(slots, tensors)
                 if tuple(t.shape) == s.shape and t.dtype == s.dtype and
                 t.device.type == s.device_type}
    received = []
    handles = []
    for s in slots:
        t = local.get(s.index)
        if t is None:
            on = device if s.device_type != "cpu" else torch.device("cpu")
            t = torch.empty(s.shape, dtype=s.dtype, device=on)
        received.append(t)
        handles.append(broadcast_async_(t, root_rank, name="optimizer_state.%d" % s.index,
                                        process_set=ps))
    for h in handles:
        synchronize(h)
    if rank() != root_rank:  # the root has its state already
        optimizer.load_state_dict(_fill_tensors(skeleton, received))


def _initialize_state(optimizer, model):
    """As Horovod: a new optimizer's state is made by one step on zero
    gradients (sparse for SparseAdam, and for SGD on a model's sparse
    embeddings); every parameter that requires grad keeps its zero .grad,
    the others keep theirs. A DistributedOptimizer steps its wrapped
    optimizer only, so no rank waits on the others' gradients."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    if getattr(type(optimizer), "_hora_distributed", False):
        super(type(optimizer), optimizer).step()
    else:
        optimizer.step()


def _collect_slots(obj, out):
    _walk(obj, lambda v: out.append(v) if isinstance(v, _TensorSlot) else None)


def _device_of(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    return torch.device("cpu")


def _to_bytes(obj):
    b = io.BytesIO()
    _pickler.dump(obj, b, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank of process_set (pickled; obj is
    ignored elsewhere)."""
    ps = _resolve_set(process_set, "broadcast_object")
    name = name or type(obj).__name__
    if rank() == root_rank:
        data = _to_bytes(obj)
        n = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        n = torch.zeros(1, dtype=torch.int64)
    broadcast_(n, root_rank, name=name + ".sz", process_set=ps)
    if rank() != root_rank:
        data = torch.empty(int(n.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name=name + ".t", process_set=ps)
    if rank() == root_rank:
        return obj
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of the obj of every rank of process_set, in rank order."""
    ps = _resolve_set(process_set, "allgather_object")
    name = name or type(obj).__name__
    data = _to_bytes(obj)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name=name + ".sz",
                      process_set=ps)
    gathered = allgather(data, name=name + ".t", process_set=ps).numpy().tobytes()
    out, off = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[off:off + n]))
        off += n
    return out
