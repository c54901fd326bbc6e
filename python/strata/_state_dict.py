"""An offloaded model read and written as torch reads and writes a model: state_dict(),
load_state_dict() and, for a Hugging Face model, a save_pretrained() that streams.

Hooks, not overrides: every module that owns an offloaded Parameter gets a state_dict hook that
puts the engine's committed weights (the fp32 masters, in the parameter's dtype, on the CPU)
in place of the placeholder, and a load_state_dict pre-hook that takes the given values out of
torch's copy into the placeholder. They are written into the engine (WriteParams) once per
load_state_dict() call, by a post-hook on the module it was called on (every module of the model
has one), and only when torch is not about to raise an error of the values themselves: a call
with a size mismatch or a value that is not a tensor writes none of them. (Missing or unexpected
keys are another matter: the hooks cannot see `strict`, torch hands them True whatever the call
said, and torch itself copies what is present before raising for them, as these hooks write
it.) An engine with NVMe folders commits them with the next step (_Offloaded.commit_written).
Registering them on the owning modules, not on the model, makes any subtree's state_dict()
right too (peft's get_peft_model_state_dict, a block's own state_dict()). Before
the optimizer binds, the parameters hold their values and torch does everything as usual.

`model.state_dict()` holds every weight at once, as it does for a torch model. A Hugging Face
model's `save_pretrained(dir)` instead streams: it plans the shards from the parameters' shapes
(`max_shard_size`, the installed transformers' default), then reads, writes and drops one shard
at a time, so its peak memory is about one shard whatever the model's size. The files are what
transformers writes (`model.safetensors`, or `model-0000i-of-0000N.safetensors` and
`model.safetensors.index.json`; config.json and generation_config.json): `from_pretrained`
loads them. Tied parameters are one tensor, written once under their first name (transformers
ties the others again at load). Calls it cannot stream (a `state_dict=` given, pickle format,
push_to_hub, a variant) go to transformers' own save_pretrained with the model's state_dict.
With several ranks reading the weights is a collective: every rank calls save_pretrained, and
only the main process writes.
"""
import functools
import inspect
import json
import os
import re
import weakref

import torch

from ._strata import Error

_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"


def install_hooks(state):
    """Registers the state_dict and load_state_dict hooks on every module that owns an
    offloaded Parameter of `state` (an _Offloaded), and the hooks that find each
    load_state_dict call's root on every module; returns their handles."""
    offloaded = {id(p) for _, p in state.all_params()}
    handles, owners = [], {}
    loading = _Loading(state)
    for m in state.model.modules():
        for p in m._parameters.values():
            if p is not None:
                owners[id(p)] = owners.get(id(p), 0) + 1
        # Before the owner's hooks: a root that owns parameters begins its load first.
        handles.append(m._register_load_state_dict_pre_hook(
            functools.partial(loading.begin, m)))
        handles.append(m.register_load_state_dict_post_hook(loading.end))
    # A tied parameter is one tensor in every module's entry of one state_dict (as torch's
    # state_dict has it, which safetensors' save_model and load_model rely on).
    tied = _TiedValues({i for i, n in owners.items() if n > 1})
    for m in state.model.modules():
        own = [(n, p) for n, p in m._parameters.items() if p is not None and id(p) in offloaded]
        if not own:
            continue
        handles.append(m._register_state_dict_hook(functools.partial(_fill_state_dict, state,
                                                                     own, tied)))
        handles.append(m._register_load_state_dict_pre_hook(
            functools.partial(loading.take, m, own)))
    return handles


class _Loading:
    """One load_state_dict() call into the offloaded model: the values its owners' pre-hooks
    took (checked against the parameters' shapes), written into the engine and committed at the
    end of the call's root module (see the module doc)."""

    def __init__(self, state):
        self.state = state
        self.root = None  # the module load_state_dict() was called on
        self.writes, self.loaded = [], set()
        self.error_msgs = None

    def begin(self, module, state_dict, prefix, local_metadata, strict, missing_keys,
              unexpected_keys, error_msgs):
        if prefix == "" or self.root is None:
            # A call on a module of the model starts at prefix "" (an earlier call that raised
            # part way leaves its writes here: they are dropped). A call on a wrapper holding
            # the model reaches it with a prefix: the first of its modules reached is the root.
            self.root, self.writes, self.loaded = module, [], set()
            self.error_msgs = error_msgs

    def take(self, module, own, state_dict, prefix, local_metadata, strict, missing_keys,
             unexpected_keys, error_msgs):
        if not self.state.holds_values():
            return
        for name, p in own:
            key = prefix + name
            if key not in state_dict:
                continue
            # Taken out of torch's (copied) dict: its copy into the placeholder would fail.
            # end() takes the key off missing_keys again.
            value = state_dict.pop(key)
            shape = self.state.shape_of(p)
            if not torch.is_tensor(value):
                error_msgs.append(f'While copying the parameter named "{key}", expected '
                                  f"torch.Tensor or Tensor-like object from checkpoint but "
                                  f"received {type(value)}")
                continue
            if tuple(value.shape) != shape:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{tuple(value.shape)} from checkpoint, the shape in current "
                                  f"model is {shape}.")
                continue
            self.writes.append((p, value))
            self.loaded.add(key)

    def end(self, module, incompatible_keys):
        if module is not self.root:
            return
        writes, loaded, self.root, self.writes, self.loaded = (self.writes, self.loaded, None,
                                                               [], set())
        missing = incompatible_keys.missing_keys
        missing[:] = [k for k in missing if k not in loaded]
        if not writes:
            return
        if self.error_msgs:
            return  # torch raises next: nothing of this call reaches the engine
        for p, value in writes:
            self.state.write_value(p, value, "load_state_dict()")
        self.state.commit_written()


class _TiedValues:
    """The values of tied parameters read for the state_dict being filled: weak references
    to that dict and to the values, so nothing outlives the caller's state_dict."""

    def __init__(self, ids):
        self.ids, self._for, self._values = ids, None, weakref.WeakValueDictionary()

    def value(self, state, p, state_dict):
        if id(p) not in self.ids:
            return state.committed_value(p, "state_dict()")
        if self._for is None or self._for() is not state_dict:
            self._for, self._values = weakref.ref(state_dict), weakref.WeakValueDictionary()
        v = self._values.get(id(p))
        if v is None:
            v = self._values[id(p)] = state.committed_value(p, "state_dict()")
        return v


def _fill_state_dict(state, own, tied, module, state_dict, prefix, local_metadata):
    if not state.holds_values():
        return
    for name, p in own:
        key = prefix + name
        if key in state_dict:
            state_dict[key] = tied.value(state, p, state_dict)


# --- save_pretrained ------------------------------------------------------------------------


def install_save_pretrained(state):
    """Gives a Hugging Face model (one with save_pretrained and a config) the streaming
    save_pretrained of the module doc, as an attribute of the instance."""
    model = state.model
    original = getattr(model, "save_pretrained", None)
    if original is None or not hasattr(model, "config") or not _is_transformers_model(model):
        return  # e.g. a peft PeftModel: its save_pretrained writes the adapter (state_dict())
    default_shard = _default_max_shard_size(original)

    @functools.wraps(original)
    def save_pretrained(save_directory, *args, is_main_process=True, state_dict=None,
                        max_shard_size=default_shard, safe_serialization=True, **kwargs):
        if (not state.holds_values() or args or state_dict is not None
                or not safe_serialization or kwargs.get("push_to_hub")
                or kwargs.get("variant")):
            if state.holds_values() and state_dict is None:
                state_dict = model.state_dict()
            return original(save_directory, *args, is_main_process=is_main_process,
                            state_dict=state_dict, max_shard_size=max_shard_size,
                            safe_serialization=safe_serialization, **kwargs)
        save_streaming(state, os.fspath(save_directory), max_shard_size, is_main_process)

    model.save_pretrained = save_pretrained


def _is_transformers_model(model):
    """A transformers PreTrainedModel (found without importing transformers)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
               for c in type(model).__mro__)


def _default_max_shard_size(save_pretrained):
    try:
        p = inspect.signature(save_pretrained).parameters.get("max_shard_size")
    except (TypeError, ValueError):
        p = None
    return p.default if p is not None and p.default is not inspect.Parameter.empty else "5GB"


def parse_size(size):
    """An int, or a string such as "5GB" (10^9) or "2GiB" (2^30), in bytes."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", str(size), re.IGNORECASE)
    if not m:
        raise Error(f"max_shard_size={size!r}: expected bytes, or a size such as \"5GB\"")
    base = 1024 if m.group(3) else 1000
    power = " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * base ** power)


def _entries(model):
    """[(key, tensor or Parameter)] that a save holds: parameters (tied ones once, under
    their first name) and persistent buffers, in the model's order."""
    out = list(model.named_parameters())
    for mname, m in model.named_modules():
        for bname, buf in m._buffers.items():
            if buf is not None and bname not in m._non_persistent_buffers_set:
                out.append((f"{mname}.{bname}" if mname else bname, buf))
    return out


def _plan_shards(entries, max_bytes):
    """Greedy in order, as transformers shards: a new shard when the next tensor would
    overflow the current one (a tensor larger than max_bytes gets a shard of its own)."""
    shards, current, size = [], [], 0
    for key, t in entries:
        n = t.numel() * t.element_size()
        if current and size + n > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((key, t))
        size += n
    if current or not shards:
        shards.append(current)
    return shards


def save_streaming(state, folder, max_shard_size, is_main_process=True):
    """Writes the model as transformers' save_pretrained does, one shard in memory at a time
    (see the module doc)."""
    from safetensors.torch import save_file  # what transformers saves with

    model = state.model
    state.check_between_steps("save_pretrained()")
    if is_main_process:
        if os.path.isfile(folder):
            raise Error(f"save_pretrained({folder!r}): that path is a file; give a folder")
        os.makedirs(folder, exist_ok=True)
    entries = _entries(model)
    shards = _plan_shards(entries, parse_size(max_shard_size))
    names = ([_WEIGHTS] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        tensors = {}
        for key, t in shard:
            if getattr(t, "_strata_offload", None) is state:
                v = state.committed_value(t, "save_pretrained()")
            else:
                v = t.detach().to("cpu").contiguous()
            tensors[key] = v
            weight_map[key] = name
            total += v.numel() * v.element_size()
        if is_main_process:
            save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        del tensors
    if not is_main_process:
        return
    _remove_stale_weights(folder, set(names))
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        with open(os.path.join(folder, _INDEX), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
    model.config.save_pretrained(folder)
    generation = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", lambda: False)
    if generation is not None and can_generate():
        generation.save_pretrained(folder)


def _remove_stale_weights(folder, keep):
    """Weights files of an earlier save in `folder` that this save did not write (as
    transformers removes them): model*.safetensors and the index, nothing else."""
    for f in os.listdir(folder):
        stale = ((f.startswith("model") and f.endswith(".safetensors")) or f == _INDEX)
        if stale and f not in keep and os.path.isfile(os.path.join(folder, f)):
            os.remove(os.path.join(folder, f))
