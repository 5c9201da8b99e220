"""Horovod's synchronised batch normalisation: hvd.SyncBatchNorm.

In training mode the batch statistics of each channel are those of the
whole batch spread over the ranks of a process set. Each rank sends its
sample count, mean and sum of squared deviations (one allgather); every
rank combines them with Chan's parallel formula, which stays exact for
uneven (even empty) per-rank batches and avoids the cancellation of
sum(x^2) - N mean^2. The backward allreduces the two per-channel sums that
the input gradient needs. The statistics travel and are combined in
float64; the arithmetic on the tensors themselves is plain torch, so it
runs on CPU and CUDA tensors alike (CUDA has not been run: no GPU in the
tests so far).
"""
import torch
import torch.nn.functional as F
from torch.autograd.function import Function
from torch.nn.modules.batchnorm import _BatchNorm

from hora.torch.mpi_ops import (Sum, _resolve_set, allgather_async, allreduce_async,
                                global_process_set, synchronize)

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over (N, C), (N, C, L), (N, C, H, W) or
    (N, C, D, H, W) inputs whose batch statistics, in training mode, are
    those of the batches of all ranks of process_set together. Running
    statistics are updated as torch's BatchNorm would over that global batch
    (the same on every rank). In eval mode, or when the set has one rank,
    it is torch's BatchNorm. weight and bias gradients are each rank's own
    contribution (their sum over the ranks is the global one), for the
    DistributedOptimizer to reduce as it does every gradient."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2 or input.dim() > 5:
            raise ValueError("SyncBatchNorm: expected a 2D to 5D input (got %dD)" % input.dim())
        if input.size(1) != self.num_features:
            raise ValueError("SyncBatchNorm: expected %d channels in dimension 1, got %d"
                             % (self.num_features, input.size(1)))

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        if self.training:
            ps = _resolve_set(self.process_set, "SyncBatchNorm")
            if ps.size() > 1:
                ps.rank()  # raises on a rank outside the set, before any collective
                return _SyncBatchNormFunction.apply(
                    input, self.weight, self.bias, running_mean, running_var,
                    self.eps, factor, ps)
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                            bn_training, factor, self.eps)


def _reduced_dims(x):
    return [0] + list(range(2, x.dim()))


def _channel_shape(x):
    return [1, x.size(1)] + [1] * (x.dim() - 2)


class _SyncBatchNormFunction(Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, factor, ps):
        # Half types are normalised in float32, as torch's kernels accumulate.
        acc = input.dtype if input.dtype in (torch.float32, torch.float64) else torch.float32
        x = input.to(acc)
        dims = _reduced_dims(x)
        C = x.size(1)
        n = x.numel() // C if C else 0
        if n > 0:
            mean_l = x.mean(dims)
            m2_l = (x - mean_l.view(_channel_shape(x))).square().sum(dims)
        else:  # an empty local batch contributes nothing
            mean_l = x.new_zeros(C)
            m2_l = x.new_zeros(C)
        row = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device),
                         mean_l.to(torch.float64), m2_l.to(torch.float64)])
        rows = synchronize(allgather_async(row.view(1, -1), name="sync_batch_norm.stats",
                                           process_set=ps))
        counts, means, m2s = rows[:, :1], rows[:, 1:1 + C], rows[:, 1 + C:]
        total = counts.sum()
        if total.item() <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel over "
                             "the process set when training, got %d" % int(total.item()))
        mean = (counts * means).sum(0) / total
        m2 = m2s.sum(0) + (counts * (means - mean).square()).sum(0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
        if running_var is not None:
            # torch's running variance is the unbiased one
            unbiased = m2 / (total - 1)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)

        mean = mean.to(acc)
        invstd = invstd.to(acc)
        shape = _channel_shape(x)
        y = (x - mean.view(shape)) * invstd.view(shape)
        if weight is not None:
            y = y * weight.to(acc).view(shape)
        if bias is not None:
            y = y + bias.to(acc).view(shape)
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.total = total.item()
        ctx.ps = ps
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        acc = mean.dtype
        x = input.to(acc)
        dy = grad_output.to(acc)
        dims = _reduced_dims(x)
        shape = _channel_shape(x)
        xmu = x - mean.view(shape)
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * xmu).sum(dims)

        grad_input = grad_weight = grad_bias = None
        if need_input:
            # The input gradient depends on the global statistics, so on the
            # sums over every rank's part of the batch.
            sums = torch.cat([sum_dy, sum_dy_xmu]).to(torch.float64)
            sums = synchronize(allreduce_async(sums, op=Sum, name="sync_batch_norm.grad_sums",
                                               process_set=ctx.ps))
            C = mean.numel()
            g_dy = (sums[:C] / ctx.total).to(acc)
            g_dy_xmu = (sums[C:] / ctx.total).to(acc)
            scale = invstd if weight is None else invstd * weight.to(acc)
            grad_input = (dy - g_dy.view(shape)
                          - xmu * (invstd.square() * g_dy_xmu).view(shape)) * scale.view(shape)
            grad_input = grad_input.to(input.dtype)
        # weight and bias: this rank's share only; the optimizer reduces them.
        if weight is not None and need_weight:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.bias_dtype is not None and need_bias:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None
