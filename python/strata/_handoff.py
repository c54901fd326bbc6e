"""Hand-offs of engine memory between the engine's compute lane and torch (see _offload.py).

Two moments per block access, both without the host waiting on the GPU:
  to_torch()   after Acquire: torch's work on the acquired parameters (or the gradient buffer)
               is ordered after the engine's copies that bring them in.
  to_engine()  before Release and before a gradient is submitted: the engine's copies (the
               parameters' next occupant, the gradient's copy out) are ordered after torch's
               work that reads the parameters and writes the gradient.

On CUDA each is an event: Stream.wait_stream records one on the stream waited for and makes
the other stream wait on it (cudaEventRecord + cudaStreamWaitEvent). The engine's compute
lane (Lane::kCompute, whose stream _strata.Engine.compute_stream hands over) is the point
every engine copy orders against: Acquire orders the lane after the block's H2D copy (and an
all-gather), and Release and SubmitGrads order the engine's later copies after the lane.

On a HostDevice torch computes on the calling thread, so its work is done when it returns:
Acquire drains the engine's compute lane before it returns (python/src/engine.cc), and
neither hand-off has anything left to order.
"""
import torch


class HostHandoff:
    """The HostDevice: torch's "stream" is the calling thread."""

    def __init__(self, core):
        self.device = torch.device("cpu")

    def to_torch(self):
        pass

    def to_engine(self):
        pass


class CudaHandoff:
    """A CUDA device: torch's current stream and the engine's compute stream, ordered by
    events; the host never waits here."""

    def __init__(self, core):
        self.device = torch.device("cuda", core.cuda_device)
        self.engine_stream = torch.cuda.ExternalStream(core.compute_stream, device=self.device)

    def to_torch(self):
        torch.cuda.current_stream(self.device).wait_stream(self.engine_stream)

    def to_engine(self):
        self.engine_stream.wait_stream(torch.cuda.current_stream(self.device))


def handoff_for(core):
    """The hand-off for the engine's device (core.device_kind)."""
    return CudaHandoff(core) if core.device_kind == "cuda" else HostHandoff(core)
