"""hora: a data-parallel training runtime. `import hora.torch as hvd` gives
Horovod's PyTorch API on it."""
from hora._lib import HoraError, HoraInternalError, HoraLoadError  # noqa: F401

__version__ = "0.1.0"

__all__ = ["HoraError", "HoraInternalError", "HoraLoadError", "__version__"]
