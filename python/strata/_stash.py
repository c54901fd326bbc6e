"""The block inputs strata.offload keeps for recompute, stashed in the engine (issue 24, point 4).

A block that is recomputed in backward needs its inputs again. Without a stash they stay in
torch's memory from the block's forward to its backward, outside every budget. With one, each
qualifying input is copied into the engine after the block's forward (Engine::StashActivation:
a pinned host slot within the host budget the states leave, and beyond those the NVMe scratch
file, checksummed), torch's copy is let go, and the block's backward fetches it back right
before the recompute (FetchActivation, last=true). A corrupt or unreadable copy raises
strata.Error (Corruption / IOError naming the activation and file) and the step is dropped,
never a wrong gradient.

What qualifies: a positional tensor argument of the block that requires grad (the residual
stream an earlier layer computed; tensors that do not, attention masks and data the caller
holds, would not be freed by a stash), a plain contiguous CPU tensor of a floating dtype with
1..activation_bytes bytes, on the CPU engine (on CUDA the device is torch's GPU; the stash is
not used there yet), while fewer than activation_count are live. Anything else stays in
torch's memory, as without a stash.

Sizes: the engine reserves its slots when it is created, which is when the optimizer binds,
before any block input exists; so offload(activation_bytes=...) gives the largest input one
block gets (batch x sequence x hidden x dtype size for a transformer), and the count is one
per block (micro-batches run forward and backward in turn: one micro-batch's inputs are live
at once).
"""
import torch

from ._sizes import parse_bytes
from ._strata import Error

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_CHOICES = ("auto", "on", "off")


class InputStash:
    """Which block inputs go into the engine, and their keys within the step. Engine calls
    happen on the training thread, inside the step (the engine's contract)."""

    def __init__(self, offload_activations, activation_bytes, blocks):
        if offload_activations not in _CHOICES:
            raise Error(f"offload(offload_activations={offload_activations!r}): expected "
                        "\"auto\", \"on\" or \"off\"")
        self.mode = offload_activations
        self.bytes = parse_bytes("activation_bytes", activation_bytes)
        if self.mode == "on" and not self.bytes:
            raise Error("offload(offload_activations=\"on\") needs activation_bytes=..., the "
                        "largest input one block gets (e.g. batch * seq * hidden * 4 for "
                        "fp32): the engine reserves its slots before the first forward")
        if self.mode == "off":
            self.bytes = 0
        self.count = blocks if self.bytes else 0
        self.enabled = False  # set by configure, once the engine's device is known
        self._next_key = 0
        self._live = 0

    def configure(self, config, cpu_engine):
        """Sets EngineConfig.activation_bytes/count before the engine is created."""
        if self.bytes and not cpu_engine:
            if self.mode == "on":
                raise Error("offload(offload_activations=\"on\") on a CUDA engine: the block "
                            "inputs are stashed only on the CPU engine for now; use \"auto\" "
                            "(they stay in torch's memory on CUDA)")
            self.bytes = self.count = 0
        config.activation_bytes = self.bytes
        config.activation_count = self.count
        self.enabled = bool(self.bytes)

    def begin_step(self):
        self._next_key = 0
        self._live = 0

    def qualifies(self, t):
        return (self.enabled and t.requires_grad and t.device.type == "cpu"
                and t.dtype in _DTYPES and t.is_contiguous() and t.layout == torch.strided
                and 0 < t.numel() * t.element_size() <= self.bytes and self._live < self.count)

    def stash(self, core, tensors):
        """Stashes the qualifying `tensors`; returns one entry per tensor: None (kept by the
        caller in torch's memory) or the stashed tensor's (key, shape, dtype, requires_grad)."""
        metas = []
        for t in tensors:
            if not self.qualifies(t):
                metas.append(None)
                continue
            key = self._next_key
            core.stash_activation(key, t.data_ptr(), t.numel() * t.element_size())
            self._next_key += 1
            self._live += 1
            metas.append((key, t.shape, t.dtype, t.requires_grad))
        return metas

    def fetch(self, core, meta):
        """The stashed tensor `meta` back in a new tensor (its key is dropped)."""
        key, shape, dtype, requires_grad = meta
        t = torch.empty(shape, dtype=dtype)
        core.fetch_activation(key, t.data_ptr(), t.numel() * t.element_size(), True)
        self._live -= 1
        return t.requires_grad_(requires_grad)
