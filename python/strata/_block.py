"""One offloaded block's forward and backward: _BlockForward replaces the block's forward and
runs it through _BlockFunction, an autograd Function that acquires the block's parameters,
runs the forward under no_grad keeping only the inputs, and in backward re-acquires them,
recomputes the forward and hands the parameter gradients to the engine (see _offload.py).

The recompute must compute what the forward computed, so it runs with the forward's
  - RNG state (dropout masks),
  - autocast state (torch.autocast: its device types, dtypes, enabled flags; backward usually
    runs outside the autocast block),
  - arguments, except a key/value cache object (a Hugging Face Cache: transformers 5 passes a
    mutable DynamicCache to every block when use_cache=True, GPT2Config's default). A block
    appends its keys and values to the cache, so a recompute on the same cache would attend
    over them twice. The layer gives the block None instead, in forward and recompute alike:
    training uses no cache, and an empty cache and none compute the same. A cache that already
    holds entries (a prefix) is refused.
The Function always takes one tensor that requires grad (the state's anchor), so that autograd
runs its backward even when no input of the block requires grad (the first block of a model
whose inputs are data, not embeddings).
"""
import contextlib

import torch

from ._strata import Error

_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_state():
    """{device type: (enabled, dtype)} of torch.autocast now, and whether its cast cache is on."""
    state = {}
    for dev in _AUTOCAST_DEVICES:
        try:  # torch >= 2.4
            state[dev] = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        except TypeError:  # torch 1.13 .. 2.3
            if dev == "cpu":
                state[dev] = (torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())
            else:
                state[dev] = (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype())
    return state, torch.is_autocast_cache_enabled()


def _autocast(saved):
    """Enters the autocast state `saved` (_autocast_state()) for the block's recompute."""
    state, cache_enabled = saved
    stack = contextlib.ExitStack()
    for dev, (enabled, dtype) in state.items():
        if dev == "cuda" and not enabled and not torch.cuda.is_available():
            continue  # torch warns about a CUDA autocast where CUDA is absent, even disabled
        stack.enter_context(torch.autocast(dev, dtype=dtype, enabled=enabled,
                                           cache_enabled=cache_enabled))
    return stack


def _is_cache(value):
    """A Hugging Face key/value cache (a subclass of transformers' Cache), found without
    importing transformers."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers.")
               for c in type(value).__mro__[:-1])


class _BlockForward:
    """Replaces a block's forward: runs it through _BlockFunction (acquire, no_grad forward,
    release; recompute in backward)."""

    def __init__(self, state, b, forward):
        self.state, self.b, self.forward = state, b, forward

    def __call__(self, *args, **kwargs):
        with self.state._clock.layer():
            return self._call(args, kwargs)

    def _call(self, args, kwargs):
        st = self.state
        if not torch.is_grad_enabled() and st.progress.next_fwd is None and st.progress.inference:
            return st.inference_forward(self.b, self.forward, args, kwargs)
        # Activation checkpointing around a block (torch.utils.checkpoint, Hugging Face's
        # model.gradient_checkpointing_enable()) runs its forward under no_grad and again in
        # backward; the layer already does both itself, and the second run would be taken for
        # a second forward.
        progress = st.progress
        if ((progress.next_fwd is not None and not torch.is_grad_enabled())
                or progress.next_bwd is not None):
            raise Error(f"block {st.block_name(self.b)} was called "
                        f"{'in backward' if progress.next_bwd is not None else 'under no_grad'}: "
                        + CHECKPOINTING_REFUSED)
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor) and v.requires_grad:
                raise Error(f"block {self.state.block_name(self.b)} got keyword argument "
                            f"{k!r}, a tensor that requires grad; pass such tensors "
                            "positionally (keyword tensors get no gradient)")
        args = tuple(self._without_cache(f"argument {i}", a) for i, a in enumerate(args))
        kwargs = {k: self._without_cache(repr(k), v) for k, v in kwargs.items()}
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return _BlockFunction.apply(self, args, kwargs, st.anchor, *tensors)

    def _without_cache(self, what, value):
        if not _is_cache(value):
            return value
        try:
            held = value.get_seq_length()
        except Exception:  # noqa: BLE001 (a cache that cannot say is taken as empty)
            held = 0
        if held:
            raise Error(f"block {self.state.block_name(self.b)} got a key/value cache "
                        f"({what}, {type(value).__name__}) that already holds {held} "
                        "positions; an offloaded model trains without a cache (the block is "
                        "recomputed in backward): pass use_cache=False and no past_key_values")
        return None


CHECKPOINTING_REFUSED = (
    "activation checkpointing around an offloaded block (torch.utils.checkpoint, "
    "model.gradient_checkpointing_enable()) is not supported and not needed, as "
    "strata.offload recomputes each block in backward itself; turn it off "
    "(model.gradient_checkpointing_disable(), or activation_checkpointing_disable() from "
    "transformers 5)")


class _ParamsSaved:
    """saved_tensors_hooks for a block whose autograd graph is kept (recompute=False): a tensor
    autograd saves that lies in one of the block's bound parameters (the parameter, a view of
    it) is saved as (parameter index, offset, size, stride) instead, and unpacked from the
    parameter bound again in backward; the engine's buffer it pointed at is reused meanwhile.
    Every other saved tensor (an activation) is kept detached, and its bytes counted: a tensor
    kept as it is holds its grad_fn, and where it is that node's own output (softmax, tanh,
    exp save theirs) the node holds it back, a cycle through autograd's C++ graph that
    Python's gc cannot see. Backward frees a graph's saved tensors and so breaks it, but
    recompute="auto" drops the graph of a block past its budget unused, and every such graph
    stayed alive (150 MiB per step on GPT-2 6x384). Autograd rebuilds the unpacked tensor's
    grad_fn itself, so the detached one saves the same."""

    def __init__(self, params):
        self.params = params
        self.regions = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), i, p.dtype)
                        for i, p in enumerate(params) if p.numel()]
        self.bytes = 0

    def pack(self, t):
        if t.numel():
            at = t.data_ptr()
            for start, end, i, dtype in self.regions:
                if start <= at < end and t.dtype == dtype:
                    return (_PARAM, i, (at - start) // t.element_size(), t.size(), t.stride())
            self.bytes += t.numel() * t.element_size()
        return t.detach()

    def unpack(self, x):
        if isinstance(x, tuple) and x[0] is _PARAM:
            _, i, off, size, stride = x
            base = self.params[i].data
            return base.as_strided(size, stride, base.storage_offset() + off)
        return x


_PARAM = object()
_TENSOR = object()  # in ctx.args: a tensor argument (saved or stashed apart)


def _detached(out):
    if isinstance(out, torch.Tensor):
        return out.detach()
    return type(out)(o.detach() if isinstance(o, torch.Tensor) else o for o in out)


class _BlockFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fwd, args, kwargs, anchor, *tensors):
        st, b = fwd.state, fwd.b
        st.block_forward_begin(b)
        # The tensors are kept apart (saved, or stashed in the engine), not in ctx.args.
        ctx.fwd, ctx.kwargs = fwd, kwargs
        ctx.args = tuple(_TENSOR if isinstance(a, torch.Tensor) else a for a in args)
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state() if st._torch_device.type == "cuda" else None
        ctx.autocast = _autocast_state()
        ctx.graph = None
        params = st.bind(b, backward=False)
        try:
            with st._clock.compute():
                if st.keeps_activations(b):
                    out = _BlockFunction._forward_kept(ctx, fwd, args, kwargs, params)
                else:
                    out = fwd.forward(*args, **kwargs)
        except BaseException as e:
            ctx.graph = None
            st.clear_params(b)  # the block stays acquired: abort_after releases it
            st.abort_after(e)
            raise
        st.unbind(b)
        if not isinstance(out, (torch.Tensor, tuple, list)):
            raise Error(f"block {st.block_name(b)} returned {type(out).__name__}; an offloaded "
                        "block returns a tensor or a tuple (tensors and other values, as Hugging "
                        "Face blocks do)")
        ctx.stashed = [None] * len(tensors)
        if ctx.graph is None:  # recomputed in backward: its inputs may wait in the engine
            try:
                ctx.stashed = st.stash_inputs(tensors)
            except BaseException as e:
                st.abort_after(e)
                raise
        st.block_forward_end(b)
        ctx.save_for_backward(*(t for t, m in zip(tensors, ctx.stashed) if m is None))
        return tuple(out) if isinstance(out, (tuple, list)) else out

    @staticmethod
    def _forward_kept(ctx, fwd, args, kwargs, params):
        """The block's forward with its autograd graph kept for backward (recompute=False, or
        "auto" within the budget); the graph is dropped, and the block recomputed in backward
        instead, when its activations would overrun the budget."""
        inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                  else a for a in args]
        hooks = _ParamsSaved(params + fwd.state.frozen_params(fwd.b))
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(hooks.pack,
                                                                           hooks.unpack):
            out = fwd.forward(*inputs, **kwargs)
        if fwd.state.keep_activations(fwd.b, hooks.bytes):
            ctx.graph = ([t for t in inputs if isinstance(t, torch.Tensor)], out)
        return _detached(out) if isinstance(out, (torch.Tensor, tuple, list)) else out

    @staticmethod
    def backward(ctx, *grad_outs):
        st = ctx.fwd.state
        with st._clock.layer():
            try:
                return _BlockFunction._backward(ctx, grad_outs)
            except BaseException as e:
                if st.progress.acquired is not None:
                    st.clear_params(st.progress.acquired[0])
                st.abort_after(e)
                raise

    @staticmethod
    def _backward(ctx, grad_outs):
        fwd = ctx.fwd
        st, b = fwd.state, fwd.b
        st.block_backward_begin(b)
        saved = iter(ctx.saved_tensors)
        params = st.bind(b, backward=True)
        if ctx.graph is not None:  # kept from forward: its saved parameters unpack from params
            (inputs, out), ctx.graph = ctx.graph, None
        else:
            inputs = [st.fetch_input(m) if m is not None else next(saved)
                      for m in ctx.stashed]
            inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
            out = _BlockFunction._recompute(ctx, inputs)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        # The outputs backward reached (a tuple's other values get no gradient).
        pairs = [(o, g) for o, g in zip(outs, grad_outs)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        need = [t for t in inputs if t.requires_grad]
        if pairs:
            with st._clock.compute():
                grads = torch.autograd.grad([o for o, _ in pairs], need + params,
                                            [g for _, g in pairs], allow_unused=True)
        else:
            grads = (None,) * (len(need) + len(params))
        st.submit(b, grads[len(need):])
        st.unbind(b)
        st.block_backward_end(b)
        gi = iter(grads[:len(need)])
        return (None, None, None, None) + tuple(next(gi) if t.requires_grad else None
                                                for t in inputs)

    @staticmethod
    def _recompute(ctx, inputs):
        """The block's forward again, as it ran: the same RNG and autocast state."""
        fwd = ctx.fwd
        it = iter(inputs)
        args = [next(it) if a is _TENSOR else a for a in ctx.args]
        cuda = [torch.cuda.current_device()] if ctx.cuda_rng is not None else []
        with torch.enable_grad(), torch.random.fork_rng(devices=cuda), _autocast(ctx.autocast):
            torch.set_rng_state(ctx.rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng)
            with fwd.state._clock.compute():
                return fwd.forward(*args, **ctx.kwargs)


def keep_activations(st, nbytes):
    """A block's forward saved `nbytes` of activations: True to keep them for backward; False
    (recompute="auto" past the budget) to drop them and recompute the block in backward."""
    if st.recompute is False or st._kept_bytes + nbytes <= activation_budget(st):
        st._kept_bytes += nbytes
        return True
    return False


def activation_budget(st):
    """Bytes of activations recompute="auto" keeps per forward: the device budget
    (Engine(device_mem=...)) less what the engine used of it in the last step (before the
    first: two of the largest block's parameters and gradient buffers); without a device
    budget, half the memory free on torch's device now."""
    if st.engine._stats is not None:
        engine_bytes = st.engine._stats["peak_device_bytes"]
    else:
        engine_bytes = 2 * 2 * 4 * max(padded for _, _, padded in st._layout)
    if st.engine.config.device_mem:
        return max(0, st.engine.config.device_mem - engine_bytes)
    if st._torch_device.type == "cuda":
        return torch.cuda.mem_get_info()[0] // 2
    return _available_host_bytes() // 2


def _available_host_bytes():
    """MemAvailable of /proc/meminfo, in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
