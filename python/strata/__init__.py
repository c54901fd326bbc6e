"""Strata from Python: offload a PyTorch model's parameters and optimizer states to pinned host
memory and NVMe (strata.Engine, strata.offload), a SIMD CPU AdamW (strata.optim.AdamW), and
NVMe tensor I/O on io_uring (strata.io.Handle).

The C++ core (strata._strata) links libstrata only, not libtorch: tensors cross as addresses,
so one build works with any torch version. Every failure is raised as strata.Error.
"""
from . import _strata
from ._strata import Error

Error.__module__ = "strata"  # tracebacks say strata.Error

__version__ = _strata.version()

from . import io, optim  # noqa: E402
from ._offload import Engine, offload, save_safetensors  # noqa: E402

__all__ = ["Engine", "Error", "__version__", "io", "offload", "optim", "save_safetensors"]
