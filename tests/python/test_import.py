"""`import strata` comes first in a fresh interpreter, with any build of torch: with a CUDA
build (PyPI's), libstrata loaded before torch bound the process to the system's libnccl and
libcudart, and torch's own import then failed (libtorch_cuda.so: undefined symbol
ncclCommResume)."""
import os
import subprocess
import sys


def test_import_strata_then_torch_in_a_fresh_interpreter():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", "import strata, torch; print(torch.ones(2).sum())"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "tensor(2.)" in r.stdout
