"""DistributedOptimizer: Horovod's optimizer wrapper on hora.

Each parameter's gradient is allreduced in place as soon as backprop has
accumulated it (a hook on its gradient accumulator), so communication
overlaps the rest of the backward pass; step() waits for all of them and
then runs the wrapped optimizer's step.
"""
import contextlib
import warnings
import weakref
from collections import Counter

import torch

from hora.torch import mpi_ops
from hora.torch.compression import Compression
from hora.torch.mpi_ops import (Average, Adasum, allreduce_async_, global_process_set,
                                sparse_allreduce_async, synchronize)

__all__ = ["DistributedOptimizer"]

# Every DistributedOptimizer, for an elastic reset to drop what they hold of
# the old membership.
_live = weakref.WeakSet()


def _reduces(process_set):
    """Whether an optimizer on process_set reduces gradients: on its members,
    when it has more than one; in an elastic job always on the world's, which
    may grow."""
    if not process_set.included():
        return False
    return process_set.size() > 1 or (process_set is global_process_set and
                                      mpi_ops._elastic_job())


def _membership_changed():
    """After an elastic reset: allreduces in flight belonged to the old
    membership (their handles are gone), so every optimizer forgets them and
    starts its gradient accumulation again; one on the world reduces from
    now on if the world has grown past one rank."""
    for opt in list(_live):
        opt._forget_pending()
        # (Never back: hooks once registered submit on every backward.)
        if (opt.process_set is global_process_set and not opt._reduces and
                _reduces(opt.process_set)):
            opt._reduces = True
            opt._register_hooks()


def _checked_names(param_groups, named_parameters, prefix):
    """named_parameters as a list, checked as Horovod checks it (tuples,
    unique names); without it, every parameter named by its place."""
    if named_parameters is not None:
        named = list(named_parameters)
    else:
        named = [("%s.noname.%s.%s" % (prefix, i, j), v)
                 for i, group in enumerate(param_groups) for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    dups = sorted(k for k, n in Counter(k for k, _ in named).items() if n > 1)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         "Found duplicates: %s" % ", ".join(dups))
    return named


def _hook_gradients(opt, zero_grads):
    """Calls opt._make_hook(p)'s hook once backprop has accumulated the
    gradient of each parameter p that requires grad."""
    post_hook = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
    for group in opt.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            if zero_grads:
                p.grad = torch.zeros_like(p)
            opt._requires_update.add(p)
            if post_hook:
                opt._grad_accs.append(p.register_post_accumulate_grad_hook(opt._make_hook(p)))
            else:
                # The AccumulateGrad node of p: its hooks run once p.grad holds the sum.
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(opt._make_hook(p))
                opt._grad_accs.append(acc)


class _DistributedOptimizer(torch.optim.Optimizer):
    # Methods of this class are copied onto a subclass of the wrapped
    # optimizer's class (see DistributedOptimizer), so super() is spelled out.

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, sparse_as_dense=False,
                 process_set=global_process_set, groups=None):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        named_parameters = _checked_names(self.param_groups, named_parameters, "allreduce")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = all_ids - named_ids
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named. Python object ids: %s"
                             % ", ".join(str(i) for i in sorted(unnamed)))
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        # Ranks outside the set, and a set of one, step on their own gradients.
        self._reduces = _reduces(process_set)
        self._handles = {}
        # Explicit groups (num_groups, groups): a group's gradients go as one
        # hora group once all of them are ready.
        self._group_of, self._group_members, self._group_ready = {}, [], []
        for members in groups or []:
            members = sorted(members, key=lambda q: self._parameter_names.get(q, ""))
            for q in members:
                self._group_of[q] = len(self._group_members)
            self._group_members.append(members)
            self._group_ready.append(set())
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        if self._reduces:
            self._register_hooks()
        _live.add(self)

    def load_state_dict(self, *args, **kwargs):
        self._forget_pending()
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def _forget_pending(self):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for ready in self._group_ready:
            ready.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        _hook_gradients(self, zero_grads=False)

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        if p.grad is None:
            # Not computed here (another rank's forward may have used it): zeros
            # keep the ranks' allreduces matched.
            p.grad = torch.zeros_like(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return self._sparse_allreduce_grad_async(p, name), None
            # Reduced dense, handed back sparse (SparseAdam takes only that).
            compressed, ctx = self._compression.compress(tensor.to_dense())
            handle = allreduce_async_(compressed, name=name, op=self.op,
                                      process_set=self.process_set)
            dense = compressed

            def finish():
                synchronize(handle)
                return self._compression.decompress(dense, ctx).to_sparse()
            return finish, None
        compressed, ctx = self._compression.compress(tensor)
        if self.op == Average:
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        else:
            prescale = postscale = 1.0
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _sparse_allreduce_grad_async(self, p, name):
        return sparse_allreduce_async(p.grad, name=name, op=self.op,
                                      process_set=self.process_set)

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times "
                        "before call to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            gid = self._group_of.get(p)
            if self._allreduce_delay[p] == 0 and gid is not None:
                self._handles[p] = (None, None)
                ready = self._group_ready[gid]
                ready.add(p)
                if len(ready) == len(self._group_members[gid]):
                    self._submit_group(gid)
                return
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def _submit_group(self, gid):
        """A group's gradients, negotiated and run as one unit."""
        mpi_ops.L.check(mpi_ops._lib.hora_group_start(), "DistributedOptimizer")
        try:
            for q in self._group_members[gid]:
                self._handles[q] = self._allreduce_grad_async(q)
        finally:
            rc = mpi_ops._lib.hora_group_end()
        mpi_ops.L.check(rc, "DistributedOptimizer")
        self._group_ready[gid].clear()

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those backprop did
        not reach) and writes the results into p.grad."""
        if not self._reduces:
            self._synchronized = True
            return
        for gid, members in enumerate(self._group_members):
            if any(q in self._requires_update and self._handles.get(q, (None,))[0] is None
                   for q in members):
                self._submit_group(gid)
        missing = self._requires_update - set(self._handles)
        for p in sorted(missing, key=lambda q: self._parameter_names.get(q, "")):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if callable(handle):
                p.grad = handle()
            else:
                output = synchronize(handle)
                p.grad.set_(self._compression.decompress(output, ctx))
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For step() after an explicit synchronize() (gradient clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        try:
            return super(self.__class__, self).step(closure)
        finally:
            _mark_step()

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """op=Adasum, as Horovod: each rank steps the wrapped optimizer on its own
    gradients, and the ranks' model updates (the change each step made to
    each parameter) are combined with Adasum; every rank then applies the
    combined update to the parameters it started the step from. A
    parameter's local step and its Adasum start from a hook once backprop
    has produced its gradient backward_passes_per_step times (gradients
    accumulate locally in between), so they overlap the rest of backprop."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 process_set):
        super(self.__class__, self).__init__(params)
        named = _checked_names(self.param_groups, named_parameters, "adasum")
        self._compression = compression
        self._parameter_names = {v: k for k, v in sorted(named, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named}
        self.process_set = process_set
        self._reduces = _reduces(process_set)
        self._handles = {}
        self._starts = {}
        self._grad_accs = []
        self._requires_update = set()
        if self._reduces:
            self._register_hooks()
        _live.add(self)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        _hook_gradients(self, zero_grads=True)  # Horovod's Adasum starts from zero grads

    def _forget_pending(self):
        # A parameter whose step had begun holds its local update: back to
        # where the step started.
        with torch.no_grad():
            for p, start in self._starts.items():
                p.copy_(start)
        self._starts = {}
        self._handles = {}
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _step_and_reduce(self, p):
        """Steps the wrapped optimizer on p alone and starts the Adasum of
        the change it made; p holds that change until step() applies it."""
        start = p.detach().clone()
        kept = []
        for group in self.param_groups:
            kept.append(group["params"])
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, kept):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)
        packed, ctx = self._compression.compress(p.detach())
        handle = allreduce_async_(packed, name="adasum." + self._parameter_names[p], op=Adasum,
                                  process_set=self.process_set)
        self._starts[p] = start
        return handle, ctx

    def _make_hook(self, p):
        def hook(*ignore):
            if self._handles.get(p, (None,))[0] is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times "
                    "before call to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally.")
            self._allreduce_delay[p] -= 1
            handle = ctx = None
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._step_and_reduce(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Nothing to wait for: the updates are combined in step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")

    def step(self, closure=None):
        if not self._reduces:
            try:
                return super(self.__class__, self).step(closure)
            finally:
                _mark_step()
        loss = closure() if closure is not None else None
        # Parameters backprop did not reach, or reached fewer than
        # backward_passes_per_step times, step now, in name order (the same
        # on every rank).
        for p in sorted(self._requires_update, key=lambda q: self._parameter_names[q]):
            if self._handles.get(p, (None,))[0] is None:
                self._handles[p] = self._step_and_reduce(p)
        with torch.no_grad():
            for p, (handle, ctx) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), ctx)
                p.copy_(self._starts.pop(p) + delta)
                self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        _mark_step()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _mark_step():
    """Ends a step of hora's step figures (hora_step_mark: compute against
    exposed communication); its result never fails the caller's step."""
    mpi_ops._lib.hora_step_mark()


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch optimizer so that step() uses gradients averaged (or
    reduced by `op`) over the ranks of process_set (on ranks outside it,
    step() uses their own). Takes Horovod's arguments; see Horovod's
    documentation for each."""
    process_set = mpi_ops._resolve_set(process_set, "DistributedOptimizer")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum:
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__, _hora_distributed=True))
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1, got %r"
                             % (backward_passes_per_step,))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step, process_set)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if groups is not None:
        if not isinstance(groups, (list, tuple)) or any(
                not isinstance(g, (list, tuple)) for g in groups):
            raise ValueError("groups should be a list of lists of torch.nn.Parameter")
        known = {id(p) for p in params}
        seen = set()
        for g in groups:
            for p in g:
                if id(p) not in known:
                    raise ValueError("groups holds a tensor that is not a parameter of the "
                                     "optimizer")
                if id(p) in seen:
                    raise ValueError("a parameter is in two of the groups")
                seen.add(id(p))
        groups = [list(g) for g in groups if g]
    elif num_groups:
        if num_groups < 0:
            raise ValueError("num_groups must not be negative, got %r" % (num_groups,))
        k = min(num_groups, len(params)) or 1
        groups = [params[i * len(params) // k:(i + 1) * len(params) // k] for i in range(k)]
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1, got %r"
                         % (backward_passes_per_step,))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__, _hora_distributed=True))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, sparse_as_dense, process_set, groups)
