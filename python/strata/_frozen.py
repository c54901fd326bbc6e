"""Frozen parameters of an offloaded model (requires_grad=False: a PEFT/LoRA base): weight-only
state, read per block from a file while the block runs, never trained, never written back.

Why not in the engine: the engine keeps, per tensor, an fp32 master, two moments and a gradient,
writes the states back after every update and reads the weights in its working dtype. A frozen
tensor needs none of that: only its values, in the dtype the model computes with (a bf16 base
is read at 2 bytes a value). So the engine holds the trainable tensors alone, and this store
holds the frozen ones, block by block:

  - where they live (a FrozenStore "source" per tensor): in place in the safetensors files given
    to strata.offload(weights=...) (a 70B base needs no second copy on disk); else in one file
    written once at the optimizer's bind, "strata.frozen.rank<r>" in the engine's first NVMe
    folder, a block's tensors together, 4 KiB aligned; else (no NVMe folder) in host memory;
  - how a block reads them: one buffer per read (3 of them, page-aligned, sized for the largest
    block), filled by strata.io.Handle (io_uring; O_DIRECT where offset, length and address are
    4 KiB aligned: a safetensors tensor's range is widened to 4 KiB boundaries, read whole and
    viewed at its offset, so only a file's unaligned tail is read buffered). Binding block b
    (forward, recompute, no_grad inference) waits for its read, points its frozen Parameters
    at views of the buffer, and starts the reads of the next two blocks the schedule will bind
    (forward: b+1, ..., the last again for backward, then b-1, ...; inference: b+1, then the
    first), so reads overlap compute. Unbinding points them back at their placeholders
    (_params.py); the buffer stays filled until another read needs it, so the last block,
    bound again right after its forward, is not read twice.
  - reads outside a step (state_dict(), save_pretrained) are zero-copy views of a private mmap
    of the file (the page cache brings in what is touched; nothing is written to the file).

Frozen parameters outside the blocks (embeddings, the final norm, the head) are not here: the
layer keeps the rest resident in torch's memory anyway (its trainable values are copied in at
each forward), so they stay plain tensors in their own dtype.

Thread safety: used from the training thread only (as the rest of the layer).
"""
import mmap
import os

import torch

from . import io as strata_io
from ._lazy import return_freed_memory
from ._owners import model_dtype
from ._params import placeholder
from ._strata import Error

ALIGN = 4096  # O_DIRECT's unit: offsets, lengths and addresses in multiples of it
_TENSOR_ALIGN = 64  # a tensor's start within a block's region of the store file
# Blocks read ahead of the one bound, each in its own buffer (one more holds the bound block):
# with one, a block's read had only the previous block's compute to hide behind, and a read
# slower than that compute stalled every step; two let a slow read borrow from the block after.
_READ_AHEAD = 2


def _up(n, a=ALIGN):
    return (n + a - 1) // a * a


def _down(n, a=ALIGN):
    return n // a * a


class _Tensor:
    """One frozen parameter: p, its name, and where its bytes lie (`path` at `offset`, `nbytes`
    bytes of `dtype`), or its value in host memory (`host`)."""

    def __init__(self, name, p, shape):
        self.name, self.p, self.shape = name, p, tuple(shape)
        self.path = None
        self.offset = self.nbytes = 0
        self.dtype = p.dtype  # of the bytes where they lie (a file may hold another)
        self.host = None
        self.at = 0  # byte offset of its bytes in its block's read buffer


class _Run:
    """One read: `length` bytes of `path` from `offset` into the buffer at `at`."""

    def __init__(self, path, offset, length, at):
        self.path, self.offset, self.length, self.at = path, offset, length, at


class FrozenStore:
    """The frozen parameters of each engine block (see the module doc)."""

    def __init__(self, blocks, shape):
        """`blocks`: per engine block, [(full name, param)] of its frozen parameters; `shape`:
        a parameter's true shape (a lazy model's are recorded apart)."""
        self.blocks = [[_Tensor(n, p, shape(p)) for n, p in ps] for ps in blocks]
        self._of = {id(t.p): t for ts in self.blocks for t in ts}
        self._runs = [[] for _ in self.blocks]
        self._slots = []  # see place()
        self._bound = None
        self._device = torch.device("cpu")
        self._handle = None
        self._maps = {}  # path -> mmap of it (committed values)
        self._placeholders = None
        self.bytes_read = 0  # by block reads, since the store was placed

    def __bool__(self):
        return bool(self._of)

    def holds(self, p):
        return id(p) in self._of

    def params(self, b):
        return [t.p for t in self.blocks[b]]

    def name_of(self, p):
        return self._of[id(p)].name

    def shape_of(self, p):
        return self._of[id(p)].shape

    # --- placing the values (at the optimizer's bind) ------------------------------------

    def place(self, in_files, values, folder, rank, device):
        """Decides where every frozen tensor lives and lets go of its value in torch's memory.
        `in_files(name)`: (path, dtype, begin, end) of a tensor read in place, or None;
        `values(b, tensors)`: gives the other tensors of block b their values (p.data; a lazy
        model materialises them); `folder`: the NVMe folder of the store file (None: host
        memory)."""
        self._device = device
        own = []
        for b, ts in enumerate(self.blocks):
            rest = []
            for t in ts:
                found = in_files(t.name)
                if found is None:
                    rest.append(t)
                    continue
                t.path, t.dtype, begin, end = found
                t.offset, t.nbytes = begin, end - begin
            if rest:
                values(b, [(t.name, t.p) for t in rest])
                own.append((b, rest))
        if own:
            if folder is None:
                for _, rest in own:
                    for t in rest:
                        t.host = t.p.detach().to("cpu").contiguous()
            else:
                self._write_store(own, os.path.join(folder, f"strata.frozen.rank{rank}"))
        self._placeholders = [[placeholder(t.shape, t.p.dtype, device) for t in ts]
                              for ts in self.blocks]
        for b in range(len(self.blocks)):
            self._plan_reads(b)
            self.clear(b)
        largest = max((_up(sum(r.length for r in runs)) for runs in self._runs), default=0)
        if largest:
            self._handle = strata_io.Handle(block_size="1M", queue_depth=32)
            # [block held or being read, buffer, requests in flight, when last used]
            self._slots = [[None, strata_io.pinned_empty(largest), [], 0]
                           for _ in range(_READ_AHEAD + 1)]
        self._uses = 0

    def _write_store(self, own, path):
        """Writes the tensors `own` ([(b, [_Tensor])]) into `path`, a block's together from a
        4 KiB boundary (one O_DIRECT read per block), and points them at it."""
        handle = strata_io.Handle(block_size="1M", queue_depth=32)
        at, layout = 0, []
        for b, ts in own:
            start, n = at, 0
            for t in ts:
                n = _up(n, _TENSOR_ALIGN)
                t.path, t.offset = path, start + n
                t.nbytes = t.p.numel() * t.p.element_size()
                t.dtype = t.p.dtype
                n += t.nbytes
            layout.append((start, _up(n), ts))
            at = start + _up(n)
        with open(path, "wb") as f:  # a new file each run: a resumed run writes it again
            f.truncate(at)
        staging = strata_io.pinned_empty(max((n for _, n, _ in layout), default=0))
        for start, n, ts in layout:
            for t in ts:
                o = t.offset - start
                raw = t.p.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                staging[o:o + t.nbytes].copy_(raw)
                t.p.data = torch.empty(0, dtype=t.p.dtype)  # the file holds it now
            handle.pwrite(staging[:n], path, start)
            staging[:n].zero_()

    def _plan_reads(self, b):
        """The reads that bring block b's file-held tensors into a buffer: its tensors sorted by
        file and offset, neighbours (less than 1 MiB apart) merged, each run widened to 4 KiB
        boundaries for O_DIRECT, a file's unaligned tail read apart (buffered)."""
        ts = sorted((t for t in self.blocks[b] if t.host is None),
                    key=lambda t: (t.path, t.offset))
        spans = []  # [path, begin, end, [tensors]]
        for t in ts:
            if spans and spans[-1][0] == t.path and t.offset - spans[-1][2] < (1 << 20):
                spans[-1][2] = max(spans[-1][2], t.offset + t.nbytes)
                spans[-1][3].append(t)
            else:
                spans.append([t.path, t.offset, t.offset + t.nbytes, [t]])
        runs, at = [], 0
        for path, begin, end, members in spans:
            size = os.path.getsize(path)
            first, last = _down(begin), min(_up(end), size)
            direct_end = _down(last) if last % ALIGN else last
            if direct_end > first:
                runs.append(_Run(path, first, direct_end - first, at))
            if last > direct_end:
                runs.append(_Run(path, max(direct_end, first), last - max(direct_end, first),
                                 at + max(direct_end, first) - first))
            for t in members:
                t.at = at + t.offset - first
            at += _up(last - first)
        self._runs[b] = runs

    # --- a block's reads ---------------------------------------------------------------

    def _slot_of(self, b):
        for s in self._slots:
            if s[0] == b:
                return s
        return None

    def _start_read(self, b):
        """Starts reading block b into a buffer no bound block uses (its earlier reads waited)."""
        if not self._runs[b] or self._slot_of(b) is not None:
            return
        # the buffer used longest ago of those no bound block reads
        slot = min((s for s in self._slots if s[0] is None or s[0] != self._bound),
                   key=lambda s: s[3])
        self._wait(slot)
        self._uses += 1
        slot[0], slot[3] = b, self._uses
        buf = slot[1]
        slot[2] = [self._handle.async_pread(buf[r.at:r.at + r.length], r.path, r.offset)
                   for r in self._runs[b]]
        self.bytes_read += sum(r.length for r in self._runs[b])

    def _wait(self, slot):
        reqs, slot[2] = slot[2], []
        try:
            for r in reqs:
                r.wait()
        except Error:
            slot[0] = None
            for r in reqs:  # nothing may still write into the buffer
                try:
                    r.wait()
                except Error:
                    pass
            raise

    def bind(self, b, upcoming):
        """Points block b's frozen Parameters at its values; starts the reads of the first
        _READ_AHEAD blocks of `upcoming` (the blocks the schedule binds next, in order) that
        hold frozen tensors and are not b."""
        ts = self.blocks[b]
        if not ts:
            return
        buf = None
        if self._runs[b]:
            self._start_read(b)
            slot = self._slot_of(b)
            self._wait(slot)
            self._uses += 1
            slot[3] = self._uses
            buf = slot[1]
        self._bound = b
        for t in ts:
            if t.host is not None:
                v = t.host
            else:
                v = buf[t.at:t.at + t.nbytes].view(t.dtype).view(t.shape)
            if v.dtype != t.p.dtype or v.device != self._device:
                v = v.to(self._device, t.p.dtype)
            t.p.data = v
        ahead = set()
        for nb in upcoming:
            if len(ahead) == _READ_AHEAD:
                break
            if nb == b or nb in ahead or not self._runs[nb]:
                continue
            ahead.add(nb)
            slot = self._slot_of(nb)
            if slot is None:
                self._start_read(nb)
            else:  # held already (backward after forward): kept from the next read's choice
                self._uses += 1
                slot[3] = self._uses

    def clear(self, b):
        """Points block b's frozen Parameters back at their placeholders."""
        if self._placeholders is None:
            return
        for t, empty in zip(self.blocks[b], self._placeholders[b]):
            t.p.data = empty
        if self._bound == b:
            self._bound = None

    def close(self):
        """Waits for the reads in flight (before their buffers go)."""
        for s in self._slots:
            try:
                self._wait(s)
            except Error:
                pass

    # --- values outside a step --------------------------------------------------------

    def value(self, p):
        """p's values, a CPU tensor of p's shape and dtype: a view of a private mmap of its file
        (no copy) when the file holds p's dtype, else a converted copy."""
        t = self._of[id(p)]
        if t.host is not None:
            v = t.host
        else:
            m = self._maps.get(t.path)
            if m is None:
                with open(t.path, "rb") as f:
                    m = self._maps[t.path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            numel = t.nbytes // torch.empty((), dtype=t.dtype).element_size()
            if t.offset % torch.empty((), dtype=t.dtype).element_size() == 0:
                v = torch.frombuffer(m, dtype=t.dtype, count=numel, offset=t.offset)
            else:  # an odd offset: a dtype-aligned view cannot be had
                raw = torch.frombuffer(m, dtype=torch.uint8, count=t.nbytes, offset=t.offset)
                v = raw.clone().view(t.dtype)
            v = v.view(t.shape)
        return v if v.dtype == p.dtype else v.to(p.dtype)

    def write(self, p, value):
        """load_state_dict into a frozen parameter: its new values are kept in host memory (a
        file given as weights= is never written)."""
        t = self._of[id(p)]
        t.host = value.detach().to("cpu", p.dtype).contiguous().clone()
        b = next(i for i, ts in enumerate(self.blocks) if t in ts)
        for s in self._slots:
            if s[0] == b:
                self._wait(s)
                s[0] = None  # its buffer no longer holds what the block reads
        self._plan_reads(b)



# --- the layer's side (an _Offloaded `state`: _offload.py) -----------------------------------


def split_frozen(state, rest, block_params):
    """Gives `state` its trainable parameters (state.rest, state.block_params: the engine's) and
    its frozen ones: a block's to a FrozenStore (state._frozen), the rest's kept as torch
    tensors (state.frozen_rest). A block left without trainable parameters still gets one
    engine tensor (_offload._NO_TRAINABLE). Sets state.dtype, the trainable ones' dtype."""
    trainable = [(n, p) for n, p in rest if p.requires_grad]
    trainable += [(n, p) for _, ps in block_params for n, p in ps if p.requires_grad]
    if not trainable:
        raise Error("every parameter of the model has requires_grad=False: there is nothing "
                    "to train (set requires_grad=True on the parameters to train, or run the "
                    "model without strata.offload)")
    state.dtype = model_dtype(state.model, trainable)
    for n, p in state.model.named_parameters():
        if not p.requires_grad and p.dtype not in (torch.float32, torch.bfloat16):
            raise Error(f"frozen parameter {n!r} is {p.dtype}; an offloaded model's frozen "
                        "parameters are float32 or bfloat16 (read in that dtype)")
    state.rest = [(n, p) for n, p in rest if p.requires_grad]
    state.frozen_rest = [(n, p) for n, p in rest if not p.requires_grad]
    state.block_params = [(prefix, [(n, p) for n, p in ps if p.requires_grad])
                          for prefix, ps in block_params]
    state._frozen_named = ([[]] if state.rest else []) + [
        [((f"{prefix}.{n}" if prefix else n), p) for n, p in ps if not p.requires_grad]
        for prefix, ps in block_params]
    state._requires_grad = {id(p): p.requires_grad for p in state.model.parameters()}
    lazy = state._lazy
    state._frozen = FrozenStore(state._frozen_named, lazy.shape if lazy else (lambda p: p.shape))


def check_requires_grad(state):
    """Refuses a requires_grad changed since strata.offload (the engine's tensors were chosen
    then)."""
    changed = [n for n, p in state.model.named_parameters()
               if state._requires_grad.get(id(p), p.requires_grad) != p.requires_grad]
    if changed:
        raise Error(f"requires_grad of {changed[:3]} changed after strata.offload; the engine "
                    "holds the parameters that were trainable then: freeze or unfreeze "
                    "(get_peft_model) before offloading")


def place_frozen(state):
    """At the optimizer's bind, once the engine is open: puts the frozen parameters where they
    are read from (see the module doc): a lazy model's in place in its weights files where they
    hold them (materialised otherwise, a block at a time), the others written once to the store
    file in the first NVMe folder (or kept in host memory without one). The frozen parameters
    outside the blocks stay in torch's memory, in their dtype."""
    lazy = state._lazy

    def values(b, named):
        if lazy is not None:
            lazy.materialise(named, own_dtype=True)

    nvme = state.engine.config.nvme
    state._frozen.place(lazy.locate if lazy is not None else (lambda name: None), values,
                        nvme[0] if nvme else None, state._core.rank, state._torch_device)
    if lazy is not None:
        lazy.materialise(state.frozen_rest, own_dtype=True)
        return_freed_memory()
    for _, p in state.frozen_rest:
        if p.device != state._torch_device:
            p.data = p.data.to(state._torch_device)


def frozen_weights(state):
    """[(full name, shape, dtype, read)] of every frozen parameter of `state` (a PEFT base):
    read() gives its values, a CPU tensor in its dtype (a block's: a view of a private mmap of
    its file, so a writer that reads one at a time holds one in memory at most)."""
    out = [(n, tuple(p.shape), p.dtype, (lambda p=p: p.detach().to("cpu")))
           for n, p in state.frozen_rest]
    store = state._frozen
    for ts in state._frozen_named:
        out += [(n, store.shape_of(p), p.dtype, (lambda p=p: store.value(p))) for n, p in ts]
    return out


def upcoming(state, b, backward):
    """The blocks the schedule binds after block b (in forward or in backward; a no_grad
    inference forward runs them again from the first), for the store's read-ahead."""
    first, last = state.first_block, state.last_block
    if state.progress.inference:
        return list(range(b + 1, last + 1)) + list(range(first, b + 1))
    if not backward:
        return list(range(b + 1, last + 1)) + list(range(last, first - 1, -1))
    return list(range(b - 1, first - 1, -1)) + list(range(first, last + 1))


def forward_root(model):
    """The module whose forward starts the model's step: the deepest one that holds every
    parameter. For a plain model, the model; for a wrapper whose forward delegates to one inner
    model (peft's PeftModel -> LoraModel -> the Hugging Face model), that inner model, which
    the wrapper's generate() also calls directly."""
    every = {id(p) for p in model.parameters()}
    root = model
    while True:
        inner = [c for c in root.children() if {id(p) for p in c.parameters()} == every]
        if len(inner) != 1:
            return root
        root = inner[0]
