"""Horovod's PyTorch API on hora: `import hora.torch as hvd`.

Works with any torch from 1.13 on; compiles nothing against it (libhora is
driven through ctypes).
"""
from hora.torch.compression import Compression  # noqa: F401
from hora.torch.exchange_ops import alltoall, alltoall_async  # noqa: F401
from hora.torch.group_ops import *  # noqa: F401,F403
from hora.torch.group_ops import __all__ as _grouped
from hora.torch.functions import (allgather_object, broadcast_object,  # noqa: F401
                                  broadcast_optimizer_state, broadcast_parameters)
from hora.torch.mpi_ops import *  # noqa: F401,F403
from hora.torch.mpi_ops import __all__ as _ops
from hora.torch.optimizer import DistributedOptimizer  # noqa: F401
from hora.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from hora.torch import elastic  # noqa: F401,E402  (hvd.elastic; needs the modules above)

__all__ = list(_ops) + list(_grouped) + [
    "alltoall", "alltoall_async", "Compression", "DistributedOptimizer", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object", "SyncBatchNorm",
    "elastic"]
