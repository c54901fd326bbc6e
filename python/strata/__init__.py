"""Strata from Python: offload a PyTorch model's parameters and optimizer states to pinned host
memory and NVMe (strata.Engine, strata.offload), a SIMD CPU AdamW (strata.optim.AdamW), and
NVMe tensor I/O on io_uring (strata.io.Handle).

The C++ core (strata._strata) links libstrata only, not libtorch: tensors cross as addresses,
so one build works with any torch version. Every failure is raised as strata.Error.
"""
# torch first: a CUDA build of torch brings its own libcudart and libnccl, and libtorch_cuda
# needs its NCCL's newer symbols (ncclCommResume). libstrata asks for the same sonames
# (libcudart.so.N, libnccl.so.2); loaded second, it shares torch's libraries instead of
# binding the process to the system's older ones first.
import torch  # noqa: F401,I001

from . import _strata
from ._strata import Error

Error.__module__ = "strata"  # tracebacks say strata.Error

__version__ = _strata.version()

from . import io, optim  # noqa: E402
from ._checkpoint import load_checkpoint, save_checkpoint, save_safetensors  # noqa: E402
from ._clip import clip_grad_norm_  # noqa: E402
from ._lazy import init_empty  # noqa: E402
from ._offload import Engine, offload  # noqa: E402
from ._deepspeed import DeepSpeedEngine, initialize  # noqa: E402

__all__ = ["DeepSpeedEngine", "Engine", "Error", "__version__", "clip_grad_norm_", "init_empty",
           "initialize", "io", "load_checkpoint", "offload", "optim", "save_checkpoint",
           "save_safetensors"]
