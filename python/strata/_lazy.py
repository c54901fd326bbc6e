"""Lazy construction: a model built with its parameters on torch's meta device (inside
strata.init_empty(), or torch.device("meta") for a model without buffers) is offloaded without
ever being whole in host memory. strata.offload swaps each meta parameter for an empty
placeholder (the model's parameters are new objects then; create the optimizer after offload,
as always) and remembers its shape; when the optimizer binds, each engine block in turn is
materialised on the CPU, filled (from safetensors files, weights=..., or by the model's own
initialisation), written to the engine (its home tier: host memory or NVMe) and let go, so host
memory holds one block's fp32 values at a time besides the engine's budget.
"""
import contextlib
import ctypes
import json
import os
import struct

import torch

from ._strata import Error

__all__ = ["init_empty"]


@contextlib.contextmanager
def init_empty():
    """Builds modules with their parameters on the meta device (no memory; constructors'
    initialisation runs on meta tensors, for nothing) and their buffers real, as they are
    needed and small. Offload the model with strata.offload; it materialises the blocks one
    at a time."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"),
                                                          requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


class LazyParams:
    """The shapes of the meta parameters strata.offload replaced, and how to fill them."""

    def __init__(self, model, weights, init):
        self.model, self.shapes = model, {}
        self.init = init
        self.files = _index(weights) if weights is not None else None
        for n, b in model.named_buffers():
            if b.is_meta:
                raise Error(f"buffer {n!r} is on the meta device; build the model inside "
                            "strata.init_empty(), which puts only the parameters there "
                            "(a buffer's values come from the model's constructor)")
        new = {}
        for m in model.modules():
            for name, p in list(m._parameters.items()):
                if p is None or not p.is_meta:
                    continue
                q = new.get(id(p))
                if q is None:  # one placeholder per parameter: tied ones stay tied
                    q = new[id(p)] = torch.nn.Parameter(torch.empty(0, dtype=p.dtype),
                                                        requires_grad=p.requires_grad)
                    self.shapes[id(q)] = p.shape
                m._parameters[name] = q

    def shape(self, p):
        return self.shapes.get(id(p), p.shape)

    def locate(self, name):
        """(path, dtype, begin, end) of tensor `name` of the model in the weights files, or
        None (no weights files, or none holds it): where a frozen parameter is read in place."""
        if self.files is None:
            return None
        key = _key(self.files, name)
        if key is None:
            return None
        path, dtype, _, begin, end = self.files[key]
        if dtype not in _DTYPES:
            raise Error(f"weights tensor {key!r} is {dtype}; F32, BF16 and F16 are read")
        return path, _DTYPES[dtype], begin, end

    def materialise(self, named, own_dtype=False):
        """Gives the parameters `named` ([(full name, param)]) their values on the CPU, in
        float32 (the engine's values) or with own_dtype in each parameter's dtype (a frozen
        one's): read from the weights files, or initialised by their modules. A parameter the
        files do not hold keeps its values (built off the meta device: a PEFT adapter) or is
        initialised."""
        lazy = [(n, p) for n, p in named if id(p) in self.shapes]
        for _, p in lazy:
            p.data = torch.empty(self.shapes[id(p)],
                                 dtype=p.dtype if own_dtype else torch.float32)
        if self.files is not None:  # every parameter, on the meta device or not
            missing = []
            with torch.no_grad():
                for n, p in named:
                    key = _key(self.files, n)
                    if key is None and id(p) in self.shapes and self.init is None:
                        if self._init_adapter(n):
                            continue
                    if key is None and id(p) in self.shapes:
                        missing.append((n, p))
                    elif key is not None:
                        _read(self.files, key, p.data)
            if missing and self.init is None:
                _read(self.files, missing[0][0], missing[0][1].data)  # raises, naming it
            lazy = missing
        else:
            lazy = [(n, p) for n, p in lazy if not self._init_adapter(n)]
        if not lazy:
            return
        ids = {id(p) for _, p in lazy}
        init = self.init or getattr(self.model, "_init_weights", None)
        with torch.no_grad():
            for m in self.model.modules():
                if not any(id(p) in ids for p in m._parameters.values() if p is not None):
                    continue
                if init is not None:
                    init(m)
                elif hasattr(m, "reset_parameters"):
                    m.reset_parameters()
                else:
                    raise Error(f"{type(m).__name__} has no reset_parameters(); give "
                                "strata.offload(init=fn) (fn(module) initialises a module's "
                                "own parameters) or weights=...")


    def _init_adapter(self, name):
        """Initialises a peft LoRA adapter's parameter `name` (built on the meta device with
        its base, as get_peft_model moves an adapter to its base layer's device) as peft does:
        its layer's reset_lora_parameters(adapter, init_lora_weights), A and B of that adapter
        at once. False when `name` is not in such an adapter."""
        parts = name.split(".")
        for i in range(len(parts) - 3, 0, -1):
            try:
                layer = self.model.get_submodule(".".join(parts[:i]))
            except AttributeError:
                continue
            if not hasattr(layer, "reset_lora_parameters"):
                continue
            adapter = parts[i + 1]
            done = self._adapters_done = getattr(self, "_adapters_done", set())
            if (id(layer), adapter) not in done:
                config = getattr(self.model, "peft_config", {}).get(adapter)
                init = getattr(config, "init_lora_weights", True)
                with torch.no_grad():
                    layer.reset_lora_parameters(adapter, init)
                done.add((id(layer), adapter))
            return True
        return False


def return_freed_memory():
    """Returns the heap memory freed since the last call to the system (glibc's malloc_trim;
    nothing elsewhere). Materialising one block at a time frees each block's tensors once the
    engine holds them, but glibc raises its mmap threshold to the size of a freed mapping, so
    later blocks come from the heap, whose freed chunks stay resident: without this, peak RSS
    grows with the model, not with the host budget."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _index(weights):
    """{tensor name: (file, dtype, shape, begin, end)} over safetensors files: a file, a list
    of them, or a folder holding *.safetensors (a sharded checkpoint)."""
    if isinstance(weights, (str, os.PathLike)):
        w = os.fspath(weights)
        files = ([os.path.join(w, f) for f in sorted(os.listdir(w)) if f.endswith(".safetensors")]
                 if os.path.isdir(w) else [w])
    else:
        files = [os.fspath(f) for f in weights]
    if not files:
        raise Error(f"weights={weights!r}: no .safetensors files there")
    index = {}
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            index[name] = (path, meta["dtype"], meta["shape"], 8 + n + begin, 8 + n + end)
    return index


def _key(index, name):
    """The name under which the weights files hold the model's tensor `name`: itself, or, in a
    model wrapped by peft (get_peft_model), the base model's name (without the wrapper's
    "base_model.model." prefix and the ".base_layer" a tuned module's weight gains)."""
    if name in index:
        return name
    if name.startswith("base_model.model."):
        base = name[len("base_model.model."):].replace(".base_layer.", ".")
        if base in index:
            return base
    return None


def _read(index, name, out):
    if name not in index:
        raise Error(f"the weights files hold no tensor {name!r} (the model's parameter names; "
                    f"they hold e.g. {sorted(index)[:3]})")
    path, dtype, shape, begin, end = index[name]
    if list(shape) != list(out.shape):
        raise Error(f"weights tensor {name!r} has shape {shape}, the model's {list(out.shape)}")
    if dtype not in _DTYPES:
        raise Error(f"weights tensor {name!r} is {dtype}; F32, BF16 and F16 are read")
    buf = bytearray(end - begin)
    with open(path, "rb") as f:
        f.seek(begin)
        f.readinto(buf)
    if buf:
        out.copy_(torch.frombuffer(buf, dtype=_DTYPES[dtype]).view(out.shape))
