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
holds, would not be freed by a stash), a plain contiguous tensor on the engine's device (the
CPU, or the engine's GPU) of a floating dtype with 1..activation_bytes bytes, while fewer than
activation_count are live. "On the engine's device" means that very device (torch.device
equality: cuda:1 is not cuda:0), not only its type: a tensor on another GPU of the process would
be copied ordered against the wrong stream and come back on the engine's GPU. Anything else
stays in torch's memory, as without a stash.

On CUDA the copies are stream-ordered, with no host wait (_handoff.py): before a stash the
engine's compute lane waits for torch's stream (the work that wrote the input); the stash's
D2H copy follows that lane, the lane waits for the copy, and torch's stream waits for the lane
before the input is let go, so torch's next kernels cannot reuse its memory under the copy. A
fetch allocates the tensor, orders the lane after torch's stream, enqueues the H2D copy (the
lane waits for it) and orders torch's stream after the lane. Not yet run on a GPU
(tests/python/test_cuda.py; tools/gpu_check_python.sh runs it there).

Sizes: the engine plans its slots when it is created, which is when the optimizer binds,
before any block input exists. offload(activation_bytes=...) gives the largest input one block
gets (batch x sequence x hidden x dtype size for a transformer), and the count is one per block
(micro-batches run forward and backward in turn: one micro-batch's inputs are live at once).
offload_activations="on" without a size learns both from the first step, which keeps its
inputs in torch's memory, and the engine is then reopened at that step's commit with the stash
(the CPU engine with NVMe folders and one rank: the reopen is Engine(resume=True)'s); "auto"
without a size leaves them in torch's memory and never reopens the engine.
"""
import warnings

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
        if self.mode == "off":
            self.bytes = 0
        self.count = blocks if self.bytes else 0
        self.enabled = False  # set by configure, once the engine's device is known
        # The engine's device (torch.device), where a stashed input lives: the CPU for a CPU
        # engine; the engine's GPU from its hand-off (set by stash(), which has it).
        self.device = torch.device("cpu")
        # Learning the sizes in the first step (mode "on" without activation_bytes): the largest
        # qualifying input and the most in one forward; None once learned or not learning.
        self.learning = self.mode == "on" and not self.bytes
        self._most_bytes = self._in_forward = self._most_in_forward = 0
        self._next_key = 0
        self._live = 0

    def configure(self, config, cpu_engine):
        """Sets EngineConfig.activation_bytes/count before the engine is created."""
        if self.learning and not (cpu_engine and config.nvme):
            raise Error("offload(offload_activations=\"on\") without activation_bytes learns "
                        "the sizes from the first step and then reopens the engine at its "
                        "commit, which needs the CPU engine with NVMe folders; give "
                        "activation_bytes=... (the largest input one block gets, e.g. batch * "
                        "seq * hidden * 4 for fp32)")
        self.device = torch.device("cpu") if cpu_engine else None  # None: until stash()
        config.activation_bytes = self.bytes
        config.activation_count = self.count
        self.enabled = bool(self.bytes)

    def begin_step(self):
        self._next_key = 0
        self._live = 0

    def begin_forward(self):
        self._in_forward = 0

    def kind_qualifies(self, t):
        return (t.requires_grad and t.device == self.device and t.dtype in _DTYPES
                and t.is_contiguous() and t.layout == torch.strided and t.numel() > 0)

    def qualifies(self, t):
        return (self.enabled and self.kind_qualifies(t)
                and t.numel() * t.element_size() <= self.bytes and self._live < self.count)

    def learn(self, tensors):
        for t in tensors:
            if self.kind_qualifies(t):
                self._most_bytes = max(self._most_bytes, t.numel() * t.element_size())
                self._in_forward += 1
                self._most_in_forward = max(self._most_in_forward, self._in_forward)

    def learned(self, st):
        """After the first step's opt.step(): reopens the engine (_Offloaded st) at that step's
        commit with the stash sized from what the step saw; without it, with a warning, where
        the host budget cannot also hold the stash's minimum."""
        if not self.learning:
            return
        self.learning = False
        if not self._most_bytes:
            return  # no block input qualified: nothing to stash
        if st.core().world_size != 1:
            warnings.warn("offload_activations=\"on\" without activation_bytes: several ranks "
                          "cannot reopen their engines one by one; the block inputs stay in "
                          "torch's memory (give activation_bytes=... to stash them)")
            return
        config = st.engine.config
        st.engine.flush()  # the step commits (pipelined updates run now)
        st.close_core("sizing the activation stash from the first step")
        config.activation_bytes, config.activation_count = self._most_bytes, self._most_in_forward
        try:
            st.resume_core()
        except Error as e:  # the host budget cannot also hold the stash's minimum
            config.activation_bytes = config.activation_count = 0
            st.resume_core()
            warnings.warn(f"offload_activations=\"on\": the block inputs stay in torch's "
                          f"memory: {e}")
        else:
            self.bytes, self.count, self.enabled = self._most_bytes, self._most_in_forward, True

    def stash(self, core, handoff, tensors):
        """Stashes the qualifying `tensors`; returns one entry per tensor: None (kept by the
        caller in torch's memory) or the stashed tensor's (key, shape, dtype, requires_grad).
        The caller may let go of a stashed tensor once this returns."""
        self.device = handoff.device
        if self.learning:
            self.learn(tensors)
        metas = [None] * len(tensors)
        ordered = False
        for i, t in enumerate(tensors):
            if not self.qualifies(t):
                continue
            if not ordered:
                handoff.to_engine()  # the copies after torch's work that wrote the inputs
                ordered = True
            key = self._next_key
            core.stash_activation(key, t.data_ptr(), t.numel() * t.element_size())
            self._next_key += 1
            self._live += 1
            metas[i] = (key, t.shape, t.dtype, t.requires_grad)
        if ordered:
            handoff.to_torch()  # torch's reuse of the inputs' memory after the copies
        return metas

    def fetch(self, core, handoff, meta):
        """The stashed tensor `meta` back in a new tensor (its key is dropped)."""
        key, shape, dtype, requires_grad = meta
        t = torch.empty(shape, dtype=dtype, device=handoff.device)
        handoff.to_engine()  # the copy after torch's last use of that memory
        core.fetch_activation(key, t.data_ptr(), t.numel() * t.element_size(), True)
        handoff.to_torch()  # torch's reads after the copy
        self._live -= 1
        return t.requires_grad_(requires_grad)
