"""strata.io: tensors to and from files on Strata's I/O backends (DeepNVMe's aio_handle use).

    h = strata.io.Handle(block_size="1M", queue_depth=32, backend="auto")
    buf = strata.io.pinned_empty((1 << 20,), torch.uint8)   # page-aligned: O_DIRECT
    h.pwrite(buf, "/nvme/x.bin")                 # blocking, GIL released
    req = h.async_pread(buf, "/nvme/x.bin", offset=0)
    ...                                          # other Python threads run meanwhile
    req.wait()                                   # or h.wait(): every request

backend "auto" is io_uring, falling back to posix (pread/pwrite on a thread pool) where the
kernel refuses io_uring; "uring" and "posix" force one. A transfer from page-aligned memory at
an aligned offset and length uses O_DIRECT; anything else is buffered. Failures (a missing
file, a short file, a full disk) are raised as strata.Error.
"""
import torch

from . import _strata
from ._sizes import parse_bytes
from ._strata import Error

__all__ = ["Handle", "Request", "pinned_empty"]


def _span(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise Error(f"strata.io transfers CPU tensors; this one is on {tensor.device} (copy it "
                    "to a strata.io.pinned_empty buffer first)")
    if not tensor.is_contiguous():
        raise Error(f"strata.io needs a contiguous tensor; this one of shape "
                    f"{tuple(tensor.shape)} is not (use .contiguous())")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


class Request:
    """One asynchronous transfer. Keeps its tensor alive until waited for."""

    def __init__(self, handle, rid, tensor):
        self._handle, self._id, self._tensor = handle, rid, tensor

    def wait(self):
        """Blocks (GIL released) until the transfer is done; raises strata.Error on failure."""
        if self._tensor is None:
            return
        try:
            self._handle._core.wait(self._id)
        finally:
            self._handle._pending.pop(self._id, None)
            self._tensor = None

    def done(self):
        return self._tensor is None


class Handle:
    def __init__(self, block_size="1M", queue_depth=32, backend="auto"):
        if queue_depth < 1:
            raise Error(f"queue_depth={queue_depth}: must be >= 1")
        self._core = _strata.IoHandle(parse_bytes("block_size", block_size), int(queue_depth),
                                      str(backend))
        self._pending = {}

    @property
    def backend(self):
        """"io_uring" or "posix": the backend this handle got."""
        return self._core.backend

    def _submit(self, write, tensor, path, offset):
        if offset < 0:
            raise Error(f"offset={offset}: must be >= 0")
        address, nbytes = _span(tensor)
        rid = self._core.submit(write, address, nbytes, str(path), int(offset))
        req = Request(self, rid, tensor)
        self._pending[rid] = req
        return req

    def async_pread(self, tensor, path, offset=0):
        """Starts reading tensor's bytes from `path` at `offset`; returns a Request."""
        return self._submit(False, tensor, path, offset)

    def async_pwrite(self, tensor, path, offset=0):
        """Starts writing tensor's bytes to `path` (created when missing) at `offset`."""
        return self._submit(True, tensor, path, offset)

    def pread(self, tensor, path, offset=0):
        """Reads tensor.numel() * element_size bytes; returns that count."""
        self.async_pread(tensor, path, offset).wait()
        return tensor.numel() * tensor.element_size()

    def pwrite(self, tensor, path, offset=0):
        """Writes the tensor's bytes; returns that count."""
        self.async_pwrite(tensor, path, offset).wait()
        return tensor.numel() * tensor.element_size()

    def wait(self):
        """Waits for every request started and not yet waited for; returns how many there
        were. Raises the first failure (after waiting for all)."""
        reqs = list(self._pending.values())
        first = None
        for r in reqs:
            try:
                r.wait()
            except Error as e:
                first = first or e
        if first is not None:
            raise first
        return len(reqs)


def pinned_empty(shape, dtype=torch.uint8):
    """A zero-filled CPU tensor in page-aligned host memory (transfers from it use O_DIRECT).
    On a CPU-only torch "pinned" means aligned; with CUDA use tensor.pin_memory() as well."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise Error(f"pinned_empty shape={shape}: dimensions must be >= 0")
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    buf = _strata.AlignedBuffer(max(nbytes, 1))
    flat = torch.frombuffer(buf, dtype=torch.uint8)[:nbytes]
    return flat.view(dtype).view(shape)
