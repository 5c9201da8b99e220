"""Gradient compression before an allreduce, as Horovod's: a compressor
narrows a tensor for the trip and restores its dtype after."""
import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _NarrowFloat(Compressor):
    """Floating tensors travel as `wire`; others as they are."""

    wire = None

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != cls.wire:
            return tensor.type(cls.wire), dtype
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        if ctx is not None and ctx != tensor.dtype:
            return tensor.type(ctx)
        return tensor


class FP16Compressor(_NarrowFloat):
    wire = torch.float16


class BF16Compressor(_NarrowFloat):
    wire = torch.bfloat16


class Compression:
    """The compressors by Horovod's names (bf16 is hora's addition)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
