"""strata.Engine and strata.offload: a user's nn.Module trained with its parameters and
optimizer states held by Strata's engine (device, pinned host memory, NVMe).

How a model maps onto the engine. Engine block 0 ("rest") holds every parameter outside the
given blocks (embeddings, final norm, a tied head); engine blocks 1..L are the given blocks, in
forward order. One micro-batch is then exactly the engine's standard schedule:

    forward:  rest (copied into the model's own tensors), block 1, ..., block L
    backward: block L, ..., block 1 (each re-acquired, and recomputed but for L: see offload()),
              rest (its gradient, accumulated by autograd in .grad, submitted when autograd
              finishes the backward)

A block's forward runs under no_grad on the acquired parameters and keeps only its inputs (in
torch's memory, or with offload(activation_bytes=...) in the engine's activation stash:
_stash.py); its backward re-acquires the block, recomputes it as it ran (_block.py) and hands
the parameter gradients to the engine, which accumulates them over micro-batches and runs AdamW
as soon as a block's gradient is final. With offload(recompute=False) (or "auto" within the
activation budget) the forward keeps autograd's graph instead, and backward runs on it with the
block acquired again (the saved parameters are unpacked from the new buffer). With one rank
the engine reads the gradients straight from torch's tensors (Engine::SubmitGradsFrom), which
are held here until it has; the only values copied per step are the rest block's weights, out
of its acquired buffer at the start of forward (the head needs them after the engine has moved
on). The engine itself is created when strata.optim.AdamW binds to the model (it needs the
optimizer's settings); its errors surface as strata.Error.

A forward under no_grad (model.eval() evaluation, Hugging Face's generate()) runs between
steps outside the engine's schedule: each block's committed weights are read from the engine
when it is called and dropped after it; its key/value cache is passed through unchanged.

An exception part way through a step (in the model's forward, in a block's recompute) drops
the step (Engine.abort_step): the engine goes back to its last commit and the next forward
starts a new step. The layer knows where in the engine's schedule the step stopped (accesses
released, the block acquired now), which is what running the step out needs.

Engine(timing=True) times the layer itself: last_step_stats()["python"] splits the seconds spent
inside it (its hooks, its autograd Function, opt.step) into engine calls, the blocks' own torch
compute (forward, recompute, their autograd.grad), copies of values into and out of the engine,
and the rest, the layer's own Python work. Off by default (each region then costs one check).

device="cuda" (not yet run on a GPU; tools/gpu_check_python.sh runs it there): the acquired
buffers are wrapped through __cuda_array_interface__ and handed between the engine's compute
lane and torch's current stream by CUDA events (_handoff.py), so the host never waits at a
block edge. The GPU is the launcher's local rank (LOCAL_RANK under torchrun; torch's current
device is set to it), and several ranks run the engine's collectives through NCCL where the
build has it.

Frozen parameters (requires_grad=False: a PEFT base) are not engine tensors: a block's are read
per use from a file by the frozen store, the rest's stay torch tensors (_frozen.py).

Dtypes: the model's trainable parameters are all float32 or all bfloat16 (frozen ones may be
either), and the engine computes in that dtype (fp32 master weights and moments either way,
unless the Engine's master_dtype="bf16", which needs a bfloat16 model: the bf16 master is its
params), so
an acquire converts nothing.
bf16 gradients are widened into the engine's fp32 gradient buffer by the copy that puts them
there. fp16 (a float16 model, torch.autocast(dtype=torch.float16), GradScaler) is refused: the
engine's gradients never reach .grad, so a GradScaler could not unscale or check them.
"""
import collections
import functools
import time

import torch

from . import _strata
from ._block import (CHECKPOINTING_REFUSED, _autocast_state, _BlockForward,
                     activation_budget, keep_activations)
from ._clock import _NO_CLOCK, _TimedCore
from ._engine import Engine
from ._frozen import (check_requires_grad, forward_root, place_frozen, split_frozen,
                      upcoming)
from ._threads import optimizer_threads
from ._handoff import handoff_for
from ._lazy import LazyParams, return_freed_memory
from ._progress import StepProgress
from ._owners import assign_owners
from ._params import mark_offloaded, placeholder, tensor_grad
from ._state_dict import install_hooks, install_save_pretrained
from ._stash import InputStash
from ._step_drop import StepDrop
from ._strata import Error

__all__ = ["Engine", "offload"]

# The one engine tensor of a block whose parameters are all frozen: the engine's schedule
# (acquire, gradient, update) runs for every block, so such a block trains one value nobody
# reads (no weight decay, gradient 0): 4 bytes of each state.
_NO_TRAINABLE = "strata.no_trainable_parameter"


def offload(model, blocks, engine, micro_batches=1, recompute=True, weights=None, init=None,
            offload_activations="auto", activation_bytes=None):
    """Moves every parameter of `model` into `engine`; returns `model`, now offloaded.

    `blocks`: the repeated sub-modules in forward order, each called once per forward.
    `recompute`: True keeps only each block's inputs and recomputes it in backward; False keeps
    autograd's activations (backward runs on them, the block's parameters acquired again);
    "auto" keeps them while this forward's kept activations fit the activation budget
    (_Offloaded.activation_budget) and recomputes the blocks after that. With True and "auto"
    the last block keeps its activations all the same, as torch's checkpoint_sequential leaves
    its last segment: its backward comes right after the head's, so a recompute would rebuild
    them at once; they are held through the head's forward and backward instead (one block's
    activations beside the head's at the peak), which saves a block's forward per micro-batch.
    A model built on the meta device (strata.init_empty()) is materialised one engine block at
    a time when the optimizer binds (_lazy.py): from `weights` (safetensors files: a file, a
    list, or a folder of shards) or by `init(module)` (default: the model's _init_weights, else
    each module's reset_parameters()).
    `offload_activations`: where a recomputed block's inputs wait for its backward (_stash.py):
    "on" stashes them in the engine (its pinned host slots within the host budget, then the
    NVMe scratch file; without `activation_bytes` sized from the first step, the engine then
    reopened at its commit), "off" keeps them in torch's memory, "auto" (the default) stashes
    them when `activation_bytes` is given (on a CUDA engine too, stream-ordered; not yet run on
    a GPU). `activation_bytes`: the
    largest input one block gets (e.g. "96K"); larger ones stay in torch's memory."""
    if not isinstance(model, torch.nn.Module):
        raise Error(f"offload(model=...) takes an nn.Module, got {type(model).__name__}")
    if not isinstance(engine, Engine):
        raise Error("offload(engine=...) takes a strata.Engine")
    if engine._model is not None:
        raise Error("this strata.Engine already holds a model; create one Engine per model")
    for p in model.parameters():
        if getattr(p, "_strata_offload", None) is not None:
            raise Error("this model is already offloaded into another strata.Engine; a model "
                        "trains in one engine (create the model anew for another)")
    if recompute not in (True, False, "auto"):
        raise Error(f"offload(recompute={recompute!r}): expected True, False or \"auto\"")
    if int(micro_batches) < 1:
        raise Error(f"micro_batches={micro_batches}: must be >= 1")
    lazy = None
    if weights is not None or any(p.is_meta for p in model.parameters()):
        lazy = LazyParams(model, weights, init)
    blocks = list(blocks)
    stash = InputStash(offload_activations, activation_bytes, len(blocks))
    state = _Offloaded(model, blocks, engine, int(micro_batches), lazy)
    state._stash = stash
    state.recompute = recompute
    engine._model = state
    return model


class _Offloaded:
    """Who owns what: the engine owns the values; this object owns the hooks, the placeholders
    the model's Parameters keep between uses, and the step's progress."""

    def __init__(self, model, blocks, engine, micro_batches, lazy=None):
        self.model, self.blocks, self.engine = model, blocks, engine
        self._lazy = lazy  # LazyParams of a model built on the meta device
        self._stash = InputStash("off", None, 0)  # the block inputs kept in the engine
        self.micro_batches = micro_batches
        if not blocks:
            raise Error("offload(blocks=[]): give the repeated sub-modules (e.g. "
                        "list(model.blocks)), in forward order")
        in_model = {id(m) for m in model.modules()}
        for i, b in enumerate(blocks):
            if not isinstance(b, torch.nn.Module) or id(b) not in in_model:
                raise Error(f"blocks[{i}] is not a sub-module of the model; `blocks` lists the "
                            "model's own repeated sub-modules")
            if any(b is c for c in blocks[:i]):
                raise Error(f"blocks[{i}] appears twice in `blocks`; list each block once")
        self._assign_owners()
        self._placeholders = None  # per engine block, once the engine holds the values
        self._drop = StepDrop(self)  # engine.abort_step() and a step dropped on an exception
        self._state_dict_hooks = install_hooks(self)
        install_save_pretrained(self)
        # Hugging Face's gradient checkpointing flag, on the blocks (transformers 5) or on a
        # module holding them (4.x); checked at each forward, as it can be set at any time.
        within = {id(m) for b in blocks for m in b.modules()}
        block_ids = {id(b) for b in blocks}
        self._checkpointing_flags = [
            m for m in model.modules() if hasattr(m, "gradient_checkpointing") and (
                id(m) in within or any(id(c) in block_ids for c in m.modules()))]
        self._clock = engine._clock or _NO_CLOCK
        # Added to the engine's step count in AdamW's bias correction: moments loaded by
        # optimizer.load_state_dict count the steps of the run that made them.
        self.step_offset = 0
        self._core = None
        self._closed = None  # why the model cannot train any more, once it cannot
        self._opt = None
        # The step's progress through the engine's schedule, and the checks of the model's
        # calls against it.
        self.progress = StepProgress(self.first_block, self.last_block, micro_batches,
                                     len(self._engine_blocks), self.block_name)
        self.recompute = True  # offload(recompute=...)
        self._kept_bytes = 0  # activations kept by this forward's blocks (recompute != True)
        # The step's waits for the engine (acquire, gradient submission, activation fetches),
        # and when its last access was released: the step's stall and tail (end_step).
        self._waited = 0.0
        self._last_release = time.perf_counter()
        self._rest_pending = False  # the rest block's gradient is waiting to be submitted
        self._written_uncommitted = False  # load_state_dict's weights, until the next step
        self.components_uncommitted = False  # states written as components, until the next step
        # (ticket, tensors) of gradients submitted from torch's memory, until the engine has
        # read them (see submit).
        self._held_grads = collections.deque()
        root = forward_root(model)  # a wrapper's (peft's PeftModel) inner model: generate()
        self._hooks = [root.register_forward_pre_hook(self._begin_forward)]
        root.forward = self._dropping_step_on_error(root.forward)
        for i, b in enumerate(blocks):
            b.forward = _BlockForward(self, self.first_block + i, b.forward)

    # --- set-up -------------------------------------------------------------------------

    def _dropping_step_on_error(self, forward):
        """The model's forward, dropping the step when it raises part way (abort_after)."""
        @functools.wraps(forward)
        def guarded(*args, **kwargs):
            try:
                return forward(*args, **kwargs)
            except BaseException as e:
                self.abort_after(e)
                raise
        return guarded

    def _assign_owners(self):
        """Every parameter gets one owner: a block (engine index) or the rest (0). The engine
        holds the trainable ones; the frozen ones (requires_grad=False) of a block go to the
        frozen store (_frozen.py), those outside the blocks stay in torch's memory."""
        rest, block_params = assign_owners(self.model, self.blocks)
        split_frozen(self, rest, block_params)
        self.first_block = 1 if self.rest else 0
        self.last_block = self.first_block + len(self.blocks) - 1
        self._engine_blocks = ([("rest", self.rest)] if self.rest else []) + self.block_params
        self._block_tensors = [[p for _, p in ps] for _, ps in self._engine_blocks]
        # id(param) -> (engine block, tensor index, full name)
        self._where = {}
        for b, (bname, ps) in enumerate(self._engine_blocks):
            for t, (n, p) in enumerate(ps):
                full = n if bname == "rest" else (f"{bname}.{n}" if bname else n)
                self._where[id(p)] = (b, t, full)
        for _, p in self.trainable_params():
            mark_offloaded(p)
            p._strata_offload = self
        for _, p in self.frozen_rest + [(n, p) for ts in self._frozen_named for n, p in ts]:
            p._strata_offload = self  # strata.optim.AdamW takes them (and leaves them alone)

    def trainable_params(self):
        """[(name, param)] the engine trains (what strata.optim.AdamW must be given)."""
        out = list(self.rest)
        for prefix, ps in self.block_params:
            out += [((f"{prefix}.{n}" if prefix else n), p) for n, p in ps]
        return out

    def all_params(self):
        """[(name, param)] whose values the layer holds apart from torch: the engine's and the
        frozen store's (not the frozen ones outside the blocks, plain tensors)."""
        yield from self.trainable_params()
        for ts in self._frozen_named:
            yield from ts

    def frozen_params(self, b):
        """Block b's frozen Parameters (bound with it: see _block._ParamsSaved)."""
        return self._frozen.params(b)

    def frozen_bytes_read(self):
        """Bytes the frozen store has read for the blocks since the optimizer bound."""
        return self._frozen.bytes_read

    def engine_blocks(self):
        """[(name, [(name, param)])] in engine order."""
        return self._engine_blocks

    def bind_optimizer(self, opt):
        """Creates the engine with `opt`'s settings and moves the parameters' values in."""
        if self._opt is not None:
            raise Error("an optimizer is already bound to this offloaded model; create one "
                        "strata.optim.AdamW per model")
        groups = opt.param_groups
        first = groups[0]
        # Each tensor is updated with its param group's settings, read at every step (see
        # step_groups), so schedulers may change any of them.
        group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
        check_requires_grad(self)
        missing = [n for n, p in self.trainable_params() if id(p) not in group_of]
        if missing:
            raise Error(f"strata.optim.AdamW must be given every parameter of the offloaded "
                        f"model that requires grad (the engine trains them all); missing: "
                        f"{missing[:3]}")
        c = self.engine.config
        c.micro_batches = self.micro_batches
        c.beta1, c.beta2 = (float(b) for b in first["betas"])
        c.eps = float(first["eps"])
        c.weight_decay = float(first["weight_decay"])  # the groups' own go with each step
        c.grad_clip = float(opt.max_grad_norm)
        cpu_engine = c.device == "cpu" or (c.device == "auto" and not _strata.cuda_available())
        c.optimizer_threads, self.threads = optimizer_threads(c.optimizer_threads or opt.threads,
                                                              cpu_engine)
        c.dtype = "bf16" if self.dtype == torch.bfloat16 else "fp32"
        self._stash.configure(c, cpu_engine=cpu_engine)
        shape = self._lazy.shape if self._lazy else (lambda p: p.shape)
        self._specs = [(bname, [(n, list(shape(p)) or [1], True, group_of[id(p)])
                                for n, p in ps] or [(_NO_TRAINABLE, [1], False, 0)])
                       for bname, ps in self.engine_blocks()]
        self._open_core(c)
        self._one_rank = self._core.world_size == 1  # gradients go in from torch's memory
        self._torch_device = self._handoff.device
        if self._torch_device.type == "cuda":
            torch.cuda.set_device(self._torch_device)  # the rank's GPU, as the engine's
        # Every block's autograd Function takes it, so that backward reaches the blocks even when
        # no block input requires grad (its gradient is None: it never accumulates one).
        self.anchor = torch.zeros((), device=self._torch_device, requires_grad=True)
        if not c.resume:
            for b, (bname, ps) in enumerate(self.engine_blocks()):
                if self._lazy:  # one block at a time in host memory
                    self._lazy.materialise([(n if bname == "rest" else f"{bname}.{n}", p)
                                            for n, p in ps])
                for t, (_, p) in enumerate(ps):
                    v = p.detach().to("cpu", torch.float32).contiguous()
                    if not self._lazy:  # broadcast_f32 writes into v; p is let go when lazy
                        v = v.clone()
                    self._core.broadcast_f32(v.data_ptr(), v.numel())  # rank 0's values
                    self._core.write_params(b, t, v.data_ptr(), v.numel())
                    if self._lazy:
                        p.data = torch.empty(0, dtype=p.dtype, device=self._torch_device)
                if self._lazy:
                    return_freed_memory()
            self._core.commit_params()
        place_frozen(self)
        # The engine holds the values now: block parameters keep a placeholder of their shape
        # (_params.py), and so do the rest's until the first forward copies them in.
        self._placeholders = [[placeholder(shape, self.dtype, self._torch_device)
                               for (_, shape, _, _) in tensors]
                              for _, tensors, _ in self._layout]
        for b in range(len(self._engine_blocks)):
            if b or not self.rest or self._lazy:
                self.clear_params(b)
        self._opt = opt

    def step_groups(self):
        """The step's settings of each param group: (lr, beta1, beta2, eps, weight_decay)."""
        out = []
        for g in self._opt.param_groups:
            beta1, beta2 = g["betas"]
            out.append((float(g["lr"]), float(beta1), float(beta2), float(g["eps"]),
                        float(g["weight_decay"])))
        return out

    def _open_core(self, config):
        self._core = _strata.Engine(self._specs, config)
        self._handoff = handoff_for(self._core)
        if self.engine._clock is not None:
            self._core = _TimedCore(self._core, self.engine._clock)
        self._layout = self._core.layout()

    def close_core(self, why="the strata.Engine of this model was closed"):
        """Ends the engine now (see _strata.Engine.close); a step in progress is dropped."""
        core, self._core = self._core, None
        self._closed = why
        self._reset_step()
        try:
            core.close()
        finally:
            self._held_grads.clear()  # after the engine stopped reading them

    def resume_core(self):
        """Opens the closed engine again at its last commit (resume=True, the engine's
        configuration as it now is): the one reopen that checkpoints, the activation stash and
        a dropped step share. The model can train again; strata.Error from the open leaves it
        closed."""
        config = self.engine.config
        config.resume = True
        self._open_core(config)
        self._closed = None

    def core(self):
        if self._closed:
            raise Error(f"{self._closed}; create a new Engine (resume=True continues a run "
                        "from its NVMe folders)")
        if self._core is None:
            raise Error("the offloaded model has no optimizer yet; create "
                        "strata.optim.AdamW(model.parameters(), ...) before the first forward")
        return self._core

    # --- views of engine memory ---------------------------------------------------------

    def _wrap(self, address, numel, dtype):
        if self._torch_device.type == "cpu":
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            return torch.frombuffer(_strata.memory(address, nbytes), dtype=dtype, count=numel)
        return _cuda_tensor(address, numel, dtype, self._torch_device)

    def _params_view(self, b, address):
        """The block's tensors as views of the acquired flat buffer."""
        _, tensors, padded = self._layout[b]
        flat = self._wrap(address, padded, self.dtype)
        return [flat[off:off + n].view(shape) for (_, shape, off, n) in tensors]

    def bind(self, b, backward):
        """Acquires engine block b and points its Parameters at the acquired buffer (and its
        frozen ones at theirs); returns the trainable ones."""
        views = self._params_view(b, self._acquire(b, backward))
        ps = self._block_tensors[b]
        for p, v in zip(ps, views):
            p.data = v  # the engine's working dtype is the model's
        self._frozen.bind(b, upcoming(self, b, backward))
        return ps

    def unbind(self, b):
        self.clear_params(b)
        self._release(b)

    def clear_params(self, b):
        """Points block b's Parameters back at their placeholders (the block stays acquired)."""
        for p, empty in zip(self._block_tensors[b], self._placeholders[b]):
            p.data = empty
        self._frozen.clear(b)

    def _acquire(self, b, backward):
        t = time.perf_counter()
        address = self._core.acquire(b, backward)
        self._waited += time.perf_counter() - t
        self.progress.acquired_now(b, backward)
        self._handoff.to_torch()
        return address

    def _release(self, b):
        self._handoff.to_engine()
        self._core.release(b)
        self._last_release = time.perf_counter()
        self.progress.released_now()

    def _copy(self, dst, src):
        """dst.copy_(src) for same-shaped tensors; on the CPU, contiguous fp32 ones go through
        memcpy (_strata.copy_bytes), measured faster than copy_ for these sizes."""
        if (self._torch_device.type == "cpu" and src.dtype == dst.dtype
                and src.device.type == "cpu" and src.is_contiguous() and dst.is_contiguous()):
            _strata.copy_bytes(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
        else:
            dst.copy_(src)

    def submit(self, b, grads):
        """Submits the block's gradients (None: zeros). With one rank and fp32 gradients the
        engine copies them straight from torch's tensors (SubmitGradsFrom), which are kept alive
        here until it has read them; otherwise they are copied into the engine's fp32 gradient
        buffer first (the reduce-scatter of several ranks reads it; bf16 is widened by that
        copy)."""
        grads = list(grads)
        grads += [None] * (len(self._layout[b][1]) - len(grads))  # _NO_TRAINABLE's
        if self._one_rank and self.dtype == torch.float32:
            self._submit_from(b, grads)
        else:
            self._submit_copied(b, grads)

    def _submit_from(self, b, grads):
        keep, addresses = [], []
        with self._clock.copy():  # nothing is copied unless a gradient is not contiguous fp32
            for g in grads:
                if g is None:
                    addresses.append(0)
                    continue
                g = g.detach()
                if (g.dtype != torch.float32 or g.device != self._torch_device
                        or not g.is_contiguous()):
                    g = g.to(self._torch_device, torch.float32).contiguous()
                keep.append(g)
                addresses.append(g.data_ptr())
            self._handoff.to_engine()
        t = time.perf_counter()
        ticket = self._core.submit_grads_from(b, addresses)
        self._waited += time.perf_counter() - t
        self.progress.submitted_now(b)
        self._held_grads.append((ticket, keep))
        self._drop_read_grads()

    def _drop_read_grads(self):
        """Lets go of the gradients the engine has finished reading."""
        held = self._held_grads
        if held:
            read = self._core.grads_read()
            while held and held[0][0] <= read:
                held.popleft()

    def _submit_copied(self, b, grads):
        _, tensors, padded = self._layout[b]
        flat = self._wrap(self._core.grad_buffer(b), padded, torch.float32)
        with self._clock.copy():
            for (_, shape, off, n), g in zip(tensors, grads):
                if g is None:
                    flat[off:off + n].zero_()
                else:
                    self._copy(flat[off:off + n], g.reshape(-1))
            self._handoff.to_engine()
        t = time.perf_counter()
        self._core.submit_grads(b)
        self._waited += time.perf_counter() - t
        self.progress.submitted_now(b)

    # --- the step -----------------------------------------------------------------------

    def _begin_forward(self, module, inputs):
        with self._clock.layer():
            self._begin_forward_timed()

    def _begin_forward_timed(self):
        core = self.core()
        if not torch.is_grad_enabled():
            self._begin_inference()
            return
        progress = self.progress
        progress.inference = False
        if self.model.training and any(m.gradient_checkpointing is True
                                       for m in self._checkpointing_flags):
            raise Error(f"the model has gradient checkpointing on: {CHECKPOINTING_REFUSED}")
        if _fp16_autocast():
            raise Error("the offloaded model runs under torch.autocast(dtype=torch.float16); "
                        "strata.offload does not train in fp16 (its gradients never reach "
                        ".grad, so a GradScaler could not unscale or check them): use "
                        "torch.autocast(..., dtype=torch.bfloat16), or a bfloat16 model")
        self._finish_backward()
        progress.check_new_micro()
        if not progress.open:
            self._clock.reset()
            groups = self.step_groups()
            core.begin_step(groups[0][0], 1.0, groups, self.step_offset)
            # BeginStep commits what was written between steps with this step.
            self._written_uncommitted = self.components_uncommitted = False
            self._waited = 0.0
            self._stash.begin_step()
        progress.micro_begun()
        self._stash.begin_forward()
        self._kept_bytes = 0
        if self.rest:
            views = self._params_view(0, self._acquire(0, False))
            with torch.no_grad(), self._clock.copy():
                for (_, p), v in zip(self.rest, views):
                    if (p.data.shape != v.shape or p.data.device != v.device
                            or not p.data.is_contiguous()):  # a placeholder
                        p.data = torch.empty(v.shape, dtype=p.dtype, device=self._torch_device)
                    self._copy(p.data, v)
                    p.grad = None
            self._release(0)
        progress.start_forward()

    # --- inference (no_grad forward, generate()) ------------------------------------------

    def _begin_inference(self):
        """A forward under no_grad (model.eval() evaluation, generate()): between steps, each
        block's weights are read from the engine (ReadParams: the committed fp32 master
        weights, wherever they live) when the block is called, and dropped after it; the
        engine's step schedule is not entered, so training goes on afterwards unchanged."""
        self._finish_backward()
        if self.progress.open:
            raise Error("a forward under no_grad (evaluation) in the middle of a training step; "
                        "call opt.step() first (or engine.abort_step() to drop the step)")
        self.progress.inference = True
        if self.rest:
            with torch.no_grad(), self._clock.copy():
                for t, (_, p) in enumerate(self.rest):
                    p.data = self._read_tensor(0, t)
                    p.grad = None

    def _read_tensor(self, b, t):
        """Tensor t of engine block b, read from the engine onto torch's device (a normal
        tensor under torch.inference_mode too: the rest block's stay for training)."""
        with torch.inference_mode(False):
            return self._read_fp32(b, t).to(self._torch_device)

    def _read_fp32(self, b, t):
        """Tensor t of engine block b: its committed fp32 master weights, a CPU tensor."""
        _, shape, _, numel = self._layout[b][1][t]
        v = torch.empty(numel, dtype=torch.float32)
        self.core().read_params(b, t, v.data_ptr(), numel)
        return v.view(shape)

    def inference_forward(self, b, forward, args, kwargs):
        """Runs block b under no_grad on weights read from the engine (see _begin_inference)."""
        if not self.progress.inference:
            raise Error(f"block {self.block_name(b)} was called under no_grad outside the "
                        "model's forward; call the offloaded model itself")
        ps = self._block_tensors[b]
        with self._clock.copy():
            for t, p in enumerate(ps):
                p.data = self._read_tensor(b, t)
            self._frozen.bind(b, upcoming(self, b, False))
        try:
            with self._clock.compute():
                return forward(*args, **kwargs)
        finally:
            self.clear_params(b)

    def stash_inputs(self, tensors):
        """A recomputed block's inputs after its forward: see _stash.py."""
        return self._stash.stash(self._core, self._handoff, tensors)

    def fetch_input(self, meta):
        """A stashed block input, back before the block's recompute."""
        t = time.perf_counter()
        try:
            return self._stash.fetch(self._core, self._handoff, meta)
        finally:
            self._waited += time.perf_counter() - t

    def keeps_activations(self, b):
        """Whether block b, now running forward, keeps its autograd graph for backward: with
        recompute=False or "auto", and with any setting for the last block (see offload()'s
        `recompute`: its recompute would rebuild the same activations right after the head)."""
        return self.recompute is not True or b == self.last_block

    def keep_activations(self, b, nbytes):
        """Block b's forward saved `nbytes` of activations: keep them (see _block.py)?"""
        if b == self.last_block:
            return True  # as above: held only through the head, not counted in the budget
        return keep_activations(self, nbytes)

    def activation_budget(self):
        return activation_budget(self)

    def block_forward_begin(self, b):
        self.progress.forward_begin(b)

    def block_forward_end(self, b):
        self.progress.forward_end(b)

    def block_backward_begin(self, b):
        self.progress.backward_begin(b)

    def block_backward_end(self, b):
        if self.progress.backward_end(b):  # the micro-batch's backward through the blocks
            self._rest_pending = bool(self.rest)
            if self._rest_pending:
                # Once autograd has finished this backward (the rest's .grad are final), submit
                # them, so that their update starts now; the next forward or opt.step() does it
                # otherwise.
                torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _finish_backward(self):
        """Submits the rest block's gradient once backward through every block is done."""
        if not self._rest_pending:
            return
        with self._clock.layer():
            self._rest_pending = False
            self._acquire(0, True)
            self.submit(0, [tensor_grad(p) for _, p in self.rest])
            for _, p in self.rest:
                p.grad = None
            self._release(0)

    def end_step(self, opt):
        with self._clock.layer():
            stats = self._end_step_timed(opt)
        # The engine sees no compute on its lanes here (torch computes outside them), so its
        # stall would be 0 and its tail the whole step: the layer's own figures replace them.
        extras = {"stall_seconds": self._waited,
                  "tail_seconds": time.perf_counter() - self._last_release}
        if self.engine._clock is not None:
            extras["python"] = self.engine._clock.snapshot()
        self.engine._ended(stats, **extras)
        self._stash.learned(self)
        self.threads.after_step(self._core, self.engine.config)

    def _end_step_timed(self, opt):
        self._finish_backward()
        self.progress.check_end()
        try:
            stats = self._core.end_step()
        finally:
            self._held_grads.clear()  # read by now, or the step failed
        self._reset_step()
        opt.last_grad_norm = stats["grad_norm"]
        opt.last_step_skipped = stats["skipped"]
        return stats

    def _reset_step(self):
        self.progress.reset()
        self._rest_pending = False
        for _, p in self.rest:
            p.grad = None

    # --- dropping a step (_step_drop.py) ------------------------------------------------

    def abort_after(self, exc):
        self._drop.abort_after(exc)

    def abort_step(self):
        self._drop.abort_step()

    def block_name(self, b):
        return repr(self.engine_blocks()[b][0])

    # --- the model read and written between steps (_state_dict.py, _params.py) ----------

    def holds_values(self):
        """Whether the engine holds the parameters' values (the optimizer has bound)."""
        return self._placeholders is not None

    def gradients_in_engine(self):
        """Whether a step is open: its gradients are accumulating in the engine."""
        return self._placeholders is not None and self.progress.open

    def param_name(self, p):
        if self._frozen.holds(p):
            return self._frozen.name_of(p)
        return self._where[id(p)][2]

    def shape_of(self, p):
        if self._frozen.holds(p):
            return self._frozen.shape_of(p)
        b, t, _ = self._where[id(p)]
        return tuple(self._layout[b][1][t][1])

    def check_between_steps(self, what):
        self.core()  # raises when the engine is closed
        if self.progress.open:
            raise Error(f"{what} in the middle of a training step: the engine holds that "
                        "step's partial state; call it after opt.step() (or drop the step "
                        "with engine.abort_step())")

    def committed_value(self, p, what):
        """Parameter p's committed weights, a CPU tensor of p's shape and dtype."""
        self.check_between_steps(what)
        if id(p) not in self._where:  # frozen: in the store, or a torch tensor
            return self._frozen.value(p) if self._frozen.holds(p) else p.detach().to("cpu")
        b, t, _ = self._where[id(p)]
        v = self._read_fp32(b, t)
        return v if p.dtype == torch.float32 else v.to(p.dtype)

    def write_value(self, p, value, what):
        """Writes `value` (p's shape) as p's weights; committed by commit_written()."""
        self.check_between_steps(what)
        if self._frozen.holds(p):
            return self._frozen.write(p, value)
        b, t, _ = self._where[id(p)]
        v = value.detach().to("cpu", torch.float32).contiguous().reshape(-1)
        self._core.write_params(b, t, v.data_ptr(), v.numel())
        if b == 0 and self.rest and p.data.is_contiguous() and p.data.shape == value.shape:
            with torch.no_grad():  # the rest's own copy, until the next forward replaces it
                p.data.copy_(value.to(p.dtype))

    def commit_written(self):
        """After load_state_dict's writes (one call's, all checked). An engine with NVMe folders
        commits them with the next step: its store commits a step once, and this one is
        committed already (at the optimizer's bind, or by the last step), so CommitParams
        would refuse. Until then save_checkpoint, which copies the committed state, refuses."""
        self._written_uncommitted = bool(self.engine.config.nvme)

    def components_written(self):
        """After Engine.write_component's writes (a checkpoint's shards, the optimizer's
        moments): with NVMe folders the next step commits them, and until then a single-rank
        save_checkpoint reads the states from the open engine, as the ranks of a multi-rank run
        save theirs, instead of copying the committed state (which does not hold them)."""
        self.components_uncommitted = bool(self.engine.config.nvme)

    def refuse_uncommitted(self, what):
        if self._written_uncommitted:
            raise Error(f"{what} after load_state_dict() and before the next step: the engine "
                        "commits the loaded weights with the next step; run a step first (or "
                        "save before loading)")

    def grad_norm(self, max_norm):
        """The open step's global gradient norm (strata.clip_grad_norm_): the engine's own,
        the value opt.last_grad_norm will hold, once every gradient is in."""
        opt_norm = self._opt.max_grad_norm if self._opt is not None else 0.0
        if not self.progress.open:
            raise Error("clip_grad_norm_ on an offloaded model outside a step (after opt.step() "
                        "or before the first backward): call it after the step's last backward "
                        "and before opt.step()")
        if opt_norm <= 0 or float(max_norm) != opt_norm:
            raise Error(f"clip_grad_norm_(max_norm={max_norm}) on an offloaded model: its "
                        f"engine clips with strata.optim.AdamW's max_grad_norm ({opt_norm}), "
                        "before any update, so that is the one clipping threshold; create the "
                        f"optimizer with strata.optim.AdamW(..., max_grad_norm={max_norm})")
        self._finish_backward()
        try:
            return self._core.grad_norm()
        except Error as e:
            raise Error(f"clip_grad_norm_ on an offloaded model: {e} (call it after the last "
                        "micro-batch's backward of the step)") from None

    def gather(self):
        """{name: fp32 CPU tensor} of the current weights (between steps)."""
        return {name: self._read_fp32(b, t) for b, t, name in self._where.values()}



def _fp16_autocast():
    """True when torch.autocast is on with float16 for the CPU or CUDA."""
    state, _ = _autocast_state()
    return any(enabled and dtype == torch.float16 for enabled, dtype in state.values())


def _cuda_tensor(address, numel, dtype, device):
    """A CUDA tensor over engine memory (__cuda_array_interface__; bf16 as int16 bits)."""
    typestr = {torch.float32: "<f4", torch.bfloat16: "<i2"}[dtype]

    class _Array:
        __cuda_array_interface__ = {"shape": (numel,), "typestr": typestr,
                                    "data": (address, False), "version": 2}

    t = torch.as_tensor(_Array(), device=device)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
