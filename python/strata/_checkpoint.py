"""Writing an offloaded (or plain) model's weights: strata.save_safetensors; and a whole run's
state, strata.save_checkpoint / load_checkpoint.

A checkpoint is a folder:
  nvme<i>/        the engine's committed state (weights, moments, step) as its NVMe folder i
                  holds it: its manifest and swap file (_strata.store_state_files; nothing else
                  of the folder), copied while the engine is closed;
  model.safetensors  the weights as plain safetensors (save_safetensors), for from_pretrained
                  or any other reader: the whole model, a PEFT model's frozen base too (in its
                  dtype, read one tensor at a time from where the frozen store holds it);
  python.pt       what lives in Python: the optimizer's param_groups (lr, betas, ...), the lr
                  scheduler's state, torch's RNG state, the caller's client_state.
load_checkpoint puts nvme<i>/ in place of those files in the engine's NVMe folders (beside them
first, then renamed over them; _store_copy.py) and reopens the engine with resume=True (as
Engine(resume=True) continues a run), so a fresh process continues bit for bit. Every file is
synced before it is renamed into place.
Only an engine with NVMe folders keeps its moments where they can be saved; without them
save_checkpoint is refused. The folder is written as `path`.partial and renamed into place; an
older checkpoint at `path` is moved to `path`.old meanwhile and removed once the new one is in
place. A crash between the two renames (or before the one rename of a first save) leaves no
`path`; the next load_checkpoint or save_checkpoint of `path` finishes the replace first (the
new folder when it is whole, else the older one back). A save removes a `path`.partial or
`path`.old left by an earlier one only when it holds nothing but a checkpoint's entries; anything
else of that name is refused (strata.Error), never deleted.

With several ranks an engine cannot be reopened in the same process (its ranks would have to
meet again), so each rank saves its own shard instead, read from the open engine between
steps:
  rank<r>.pt      rank r's shard of every block's master weights and Adam moments (fp32, as
                  Engine.read_component gives them) and its torch RNG state;
  model.safetensors, python.pt   as above, written by rank 0 (the weights gathered one tensor
                  at a time, so that no rank holds the whole model: _write_gathered_safetensors);
  strata.json     {"step", "world_size", "format": "shards"}.
One rank saves this way too while its engine holds states written since its last commit (a
re-sharded load's, optimizer.load_state_dict's moments; the next step commits them): its
committed state, which the folders copy, does not hold them.
load_checkpoint with as many ranks writes each rank's shard back into its open engine
(Engine.write_component; the next step commits it first) and continues the step count (the bias
correction's) from the checkpoint's, so fresh ranks continue bit for bit. On another number of
ranks (one included) each rank builds its new shards from the saved ranks' files, read one at a
time (_checkpoint_shards.py), and writes them the same way. The folder must be one
that every rank reaches (one host, or a shared filesystem). Every rank calls both. The ranks
agree after each phase (a one-value all-gather of "did this rank fail"), so a rank that fails
(a missing or damaged shard, a full disk, a folder it cannot write) raises its own error and
every other rank raises strata.Error naming the failed ranks, at once, instead of waiting for
the communicator's timeout. A failed save leaves `path` as it was (the .partial folder is
removed); a failed load writes nothing into any engine.
"""
import contextlib
import functools
import json
import math
import os
import re
import shutil
import struct

import torch

from . import _strata
from ._frozen import frozen_weights
from ._store_copy import check_digests, copy_state_in, copy_state_out
from ._strata import Error

__all__ = ["load_checkpoint", "read_moments", "save_checkpoint", "save_safetensors",
           "write_moments"]


def _offloaded_state(model, what):
    for p in model.parameters():
        state = getattr(p, "_strata_offload", None)
        if state is not None:
            return state
        break
    raise Error(f"{what} takes a model given to strata.offload (for a plain torch model use "
                "torch.save of its state_dict)")


def _ready_between_steps(state, what):
    state.core()
    if state.progress.open:
        raise Error(f"{what} in the middle of a step; call opt.step() first (or "
                    "engine.abort_step() to drop the step)")
    if state._opt is None:
        raise Error(f"{what} before the optimizer was created; create strata.optim.AdamW first")


def _closed_engine(state, what):
    """Checks the engine can be closed between steps for `what`; returns its NVMe folders."""
    _ready_between_steps(state, what)
    nvme = list(state.engine.config.nvme)
    if not nvme:
        raise Error(f"{what} needs an engine with NVMe folders (strata.Engine(nvme=[...])): "
                    "the committed state there (weights, moments, step) is what a checkpoint "
                    "holds; without them use strata.save_safetensors for the weights alone")
    return nvme


def _write_synced(path, write):
    """write(f) into a new binary file at `path`, then made durable (fsync)."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _reopened(state, why, between):
    """Closes the engine, runs between() on its quiescent NVMe folders, reopens it at its
    (possibly replaced) last commit. When between() fails, its error is the one raised, after
    the engine reopened at what the folders hold (or, when it cannot, with that error as its
    cause: the model then stays closed)."""
    state.close_core(why)
    try:
        between()
    except BaseException as failure:
        try:
            state.resume_core()
        except Exception as e:
            raise failure from e
        raise
    state.resume_core()


def _moments_access(state, what):
    """Checks the moments can be read or written now; returns (engine steps committed,
    {id(param): (engine block, offset, numel, shape)})."""
    core = state.core()
    if state.progress.open:
        raise Error(f"{what} in the middle of a step; call opt.step() first")
    stats = state.engine._stats
    steps = stats["step"] if stats is not None else core.resumed_step()
    where = {}
    for b, (_, tensors, padded) in enumerate(state._layout):
        for (_, p), (_, shape, off, n) in zip(state.engine_blocks()[b][1], tensors):
            where[id(p)] = (b, off, n, shape)
    return steps, where


def _check_step_goes_on(state, steps, step, what):
    """An engine with NVMe folders commits each step under the count its bias correction uses
    (the engine's steps + state.step_offset), so that a resumed engine goes on counting with no
    offset to restore; the store's steps only increase. Moments of step `step` loaded where the
    count has reached a later step would make the next commit go back: refused here, before
    anything changes."""
    now = steps + state.step_offset
    if state.engine.config.nvme and step < now:
        raise Error(f"{what}: the state loaded is of step {step}, and this engine's NVMe store "
                    f"has counted {now} steps (its commits only go forward); load it into an "
                    "engine with empty NVMe folders (strata.Engine(nvme=[...]) in a new folder), "
                    "or one without NVMe folders")


def _agree(core, what, phase):
    """Runs phase() on this rank, then every rank reaches this point before any leaves it (a
    one-value all-gather of whether the phase failed here). Raises the phase's own exception on
    a rank where it failed, and strata.Error naming the failed ranks on the others."""
    failure = None
    try:
        phase()
    except Exception as e:  # noqa: BLE001 (re-raised below, after the other ranks know)
        failure = e
    flag = torch.tensor([1.0 if failure is not None else 0.0], dtype=torch.float32)
    every = torch.empty(core.world_size, dtype=torch.float32)
    core.all_gather_f32(flag.data_ptr(), 1, every.data_ptr())
    if failure is not None:
        raise failure
    failed = [r for r, v in enumerate(every.tolist()) if v]
    if failed:
        ranks = ", ".join(map(str, failed))
        raise Error(f"{what} failed on rank{'s' if len(failed) > 1 else ''} {ranks} (its error "
                    "says why); nothing was changed here")


def _read_whole(core, padded, name, b):
    """(component `name` of engine block `b`, all `padded` values: this rank's shard, gathered
    from every rank with several; None), or with several ranks (None, the error) when this
    rank's shard cannot be read. A collective: every rank calls it, in the same order; a rank
    whose read fails still joins the gather (with zeros), which the other ranks wait for."""
    world = core.world_size
    shard = torch.zeros(padded // world, dtype=torch.float32)
    failure = None
    try:
        core.read_component(b, name, shard.data_ptr(), shard.numel())
    except Exception as e:  # noqa: BLE001 (returned: the caller raises it after its gathers)
        if world == 1:
            raise
        failure = e
    if world == 1:
        return shard, None
    whole = torch.empty(padded, dtype=torch.float32)
    core.all_gather_f32(shard.data_ptr(), shard.numel(), whole.data_ptr())
    return (None, failure) if failure is not None else (whole, None)


def read_moments(state, opt):
    """torch's optimizer "state" of an offloaded model, read from the engine between steps:
    {index of the parameter in opt's param_groups: {"step", "exp_avg", "exp_avg_sq"}}.
    With several ranks every rank calls it (each component is gathered, a collective): a rank
    whose read fails goes through every gather all the same and raises its error after the
    last, and the other ranks then raise strata.Error naming it (they used to wait in the next
    gather until the communicator's timeout)."""
    core = state.core()
    steps, where = _moments_access(state, "optimizer.state_dict()")
    step = steps + state.step_offset
    params = [p for g in opt.param_groups for p in g["params"]]
    whole = {}

    def read_all():  # in the same order on every rank
        failure = None
        for b in sorted({where[id(p)][0] for p in params}):
            for k in ("exp_avg", "exp_avg_sq"):
                whole[(b, k)], failed = _read_whole(core, state._layout[b][2], k, b)
                failure = failure or failed
        if failure is not None:
            raise failure

    if core.world_size == 1:
        read_all()
    else:
        _agree(core, "optimizer.state_dict()", read_all)
    out = {}
    for i, p in enumerate(params):
        b, off, n, shape = where[id(p)]
        out[i] = {"step": torch.tensor(float(step)),
                  **{k: whole[(b, k)][off:off + n].view(shape).clone()
                     for k in ("exp_avg", "exp_avg_sq")}}
    return out


def write_moments(state, opt, moments):
    """optimizer.load_state_dict's moments into the engine: `moments` is {index of the parameter
    in opt's param_groups: {"step", "exp_avg", "exp_avg_sq"}} for every parameter, one step for
    all. Written between steps (Engine.write_component), committed with the next step, whose
    bias correction then counts from that step (state.step_offset)."""
    core = state.core()
    steps, where = _moments_access(state, "optimizer.load_state_dict()")
    names = {id(p): n for n, p in state.all_params()}
    params = [p for g in opt.param_groups for p in g["params"]]
    missing = [names.get(id(p), str(i)) for i, p in enumerate(params) if i not in moments]
    if missing:
        raise Error(f"optimizer.load_state_dict(): the state holds moments for {len(moments)} of "
                    f"the {len(params)} parameters (none for {missing[:3]}); the engine keeps "
                    "one step count for all, so give every parameter's (or \"state\": {} to "
                    "load only the param_groups' settings)")
    step_of = {float(s["step"]) for s in moments.values()}
    if len(step_of) != 1:
        raise Error(f"optimizer.load_state_dict(): the parameters' steps differ "
                    f"({sorted(step_of)}); the engine keeps one step count for all")
    step = int(step_of.pop())
    _check_step_goes_on(state, steps, step, "optimizer.load_state_dict()")
    put = {}  # (engine block, component) -> [(offset, values)]
    for i, p in enumerate(params):
        b, off, n, shape = where[id(p)]
        for k in ("exp_avg", "exp_avg_sq"):
            v = moments[i][k]
            if v.numel() != n:
                raise Error(f"optimizer.load_state_dict(): {k} of {names.get(id(p), i)} has "
                            f"shape {tuple(v.shape)}; the parameter has {tuple(shape)}")
            put.setdefault((b, k), []).append((off, v.detach().to("cpu", torch.float32)))
    for (b, k), parts in sorted(put.items()):
        # Each rank writes its own shard, [lo, lo + n) of the component: read (it keeps the
        # padding and what no parameter here covers) and overwritten where a parameter's lies.
        n = state._layout[b][2] // core.world_size
        lo = core.rank * n
        shard = torch.empty(n, dtype=torch.float32)
        core.read_component(b, k, shard.data_ptr(), n)
        for off, v in parts:
            first, end = max(off, lo), min(off + v.numel(), lo + n)
            if first < end:
                shard[first - lo:end - lo] = v.reshape(-1)[first - off:end - off]
        core.write_component(b, k, shard.data_ptr(), n)
    state.components_written()
    state.step_offset = step - steps


def _replace_folder(new, path):
    """Puts the complete folder `new` at `path`. An older checkpoint there is moved aside first
    and removed only once the new one is in place, so that a crash in between leaves it (as
    `path`.old) rather than nothing."""
    old = path + ".old"
    if os.path.exists(path):
        _remove_leftover(old)
        os.rename(path, old)
    try:
        os.rename(new, path)
    except BaseException:
        if os.path.exists(old) and not os.path.exists(path):
            os.rename(old, path)  # the older one back where it was
        raise
    shutil.rmtree(old, ignore_errors=True)  # the checkpoint that was at `path` (checked)


# What a checkpoint folder (and so a `path`.partial or `path`.old of this module's) holds.
_CHECKPOINT_ENTRY = re.compile(r"(nvme\d+|rank\d+\.pt|model\.safetensors|python\.pt|strata\.json)")


def _holds_only_a_checkpoint(folder):
    """True when `folder` is a real folder (not a link) holding nothing but the entries a
    checkpoint has (so possibly none): a leftover of this module's, safe to remove."""
    return (os.path.isdir(folder) and not os.path.islink(folder)
            and all(_CHECKPOINT_ENTRY.fullmatch(n) for n in os.listdir(folder)))


def _remove_leftover(folder):
    """Removes `path`.partial or `path`.old left by an earlier save before this one uses the
    name; strata.Error (nothing removed) when something else is there, so that a folder of the
    user's own that happens to have that name is never deleted."""
    if not os.path.lexists(folder):
        return
    if not _holds_only_a_checkpoint(folder):
        raise Error(f"save_checkpoint: {folder} is in the way: a save uses that name for the "
                    "checkpoint it writes (.partial) or replaces (.old), and it holds what is not "
                    "a checkpoint's; move or remove it, or save under another path")
    shutil.rmtree(folder)


def _check_replaceable(path):
    """A save replaces `path` whole: refused (strata.Error, before anything is written) unless
    it is absent, an empty folder or a strata checkpoint, so that a folder of the user's own is
    never taken for an older checkpoint and removed."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        raise Error(f"save_checkpoint: {path} exists and is not a folder; a checkpoint is a "
                    "folder that replaces what is at its path: give a new path")
    if os.listdir(path) and not os.path.isfile(os.path.join(path, "strata.json")):
        raise Error(f"save_checkpoint: {path} is a folder that is not a strata checkpoint (no "
                    "strata.json), and saving would replace it with everything in it: give a "
                    "new or empty folder, or remove it first")


def _finish_interrupted_replace(path):
    """A crash between _replace_folder's two renames leaves no `path`: the older checkpoint (if
    any) is at `path`.old and the new one at `path`.partial. Completes that replace when the new
    folder is whole (strata.json, written last, is there), else puts the older one back, so
    that load_checkpoint and the next save find a checkpoint at `path`."""
    old, new = path + ".old", path + ".partial"
    if os.path.exists(path):
        return
    if os.path.isfile(os.path.join(new, "strata.json")):
        os.rename(new, path)
        if _holds_only_a_checkpoint(old):
            shutil.rmtree(old)
    elif os.path.exists(old):
        os.rename(old, path)


def _torch_load(path):
    """torch.load of a file this module wrote: pickled Python state (param_groups, the
    scheduler's state, client_state), which torch >= 2.6 refuses by default (weights_only)."""
    kw = {"weights_only": False} if "weights_only" in torch.load.__code__.co_varnames else {}
    return torch.load(path, **kw)


def _python_state(state, opt, lr_scheduler, client_state, step, **extra):
    return {"step": step,
            "param_groups": [{k: v for k, v in g.items() if k != "params"}
                             for g in opt.param_groups],
            "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler else None,
            "rng": torch.get_rng_state(), "client_state": client_state,
            "step_offset": state.step_offset, **extra}


def _checkpoint_meta(path):
    try:
        with open(os.path.join(path, "strata.json")) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise Error(f"{path} is not a strata checkpoint (no strata.json)") from None
    except ValueError as e:
        raise Error(f"{path}/strata.json is damaged: {e}") from None
    if not isinstance(meta, dict):
        raise Error(f"{path}/strata.json is damaged: it holds a {type(meta).__name__}, not an "
                    "object")
    return meta


def _restore_python_state(state, saved, optimizer, lr_scheduler):
    opt = optimizer or state._opt
    for g, s in zip(opt.param_groups, saved["param_groups"]):
        g.update(s)
    if lr_scheduler is not None and saved["lr_scheduler"] is not None:
        lr_scheduler.load_state_dict(saved["lr_scheduler"])
    state.engine._stats = None


def save_checkpoint(model, path, optimizer=None, lr_scheduler=None, client_state=None):
    """Writes the run's state after the last opt.step() into the folder `path` (replaced when
    it exists); see the module docstring. With one rank the engine is closed and reopened
    meanwhile; with several, every rank calls it and saves its own shard. A path that cannot
    be a checkpoint's folder ("", "/", "x/.."), or a file system without room for it, is
    strata.Error before anything is written; any other failure (a full disk midway, a folder
    it may not write) is strata.Error naming the path, with nothing left of this save."""
    state = _offloaded_state(model, "save_checkpoint")
    path = _checkpoint_path(path, "save_checkpoint")
    from ._checkpoint_shards import save_shards  # it imports this module
    if state.core().world_size != 1:
        return save_shards(model, state, path, optimizer, lr_scheduler, client_state)
    state.refuse_uncommitted(f"save_checkpoint({path!r})")  # it copies the committed state
    if state.components_uncommitted:  # the committed state does not hold them: read the engine
        return save_shards(model, state, path, optimizer, lr_scheduler, client_state)
    nvme = _closed_engine(state, "save_checkpoint")
    what = f"save_checkpoint({path!r})"
    with _os_errors(what, "nothing was saved, and what was at the path is as it was"):
        _finish_interrupted_replace(path)
        _check_replaceable(path)
        _check_room(state, path, nvme, what)
        tmp = path + ".partial"
        _remove_leftover(path + ".old")
        _remove_leftover(tmp)
        os.makedirs(tmp)
        try:
            digests = {}
            _reopened(state, "saving a checkpoint",
                      lambda: digests.update(copy_state_out(nvme, tmp, what)))
            step = state.core().resumed_step()
            save_safetensors(model, os.path.join(tmp, "model.safetensors"))
            opt = optimizer or state._opt
            _write_synced(os.path.join(tmp, "python.pt"), lambda f: torch.save(
                _python_state(state, opt, lr_scheduler, client_state, step, folders=len(nvme),
                              files=digests), f))
            # Written last: a .partial folder with strata.json is whole
            # (_finish_interrupted_replace).
            _write_synced(os.path.join(tmp, "strata.json"), lambda f: f.write(
                json.dumps({"step": step, "folders": len(nvme)}).encode()))
            _replace_folder(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # `path` stays as it was
            raise
    return path


def _checkpoint_path(path, what):
    """`path` as a checkpoint's folder name: trailing slashes dropped ("dir/" is "dir", whose
    scratch folder is "dir.partial" beside it, not "dir/.partial" inside it); strata.Error for
    a path that names no folder of its own."""
    path = os.fsdecode(os.fspath(path))
    folder = path.rstrip("/")
    if not folder or os.path.basename(folder) in (".", ".."):
        raise Error(f"{what}({path!r}): give the checkpoint's own folder (a name such as "
                    "\"ckpt/step100\"); an empty path, \"/\", \".\" or \"..\" names none")
    return folder


@contextlib.contextmanager
def _os_errors(what, outcome):
    """An OSError inside (a full disk, a folder it may not write) raised as strata.Error that
    names the file and says what became of the checkpoint."""
    try:
        yield
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise Error(f"{what}: {e.strerror or e}{where}; {outcome}") from e


def _check_room(state, path, nvme, what):
    """strata.Error, before anything is written, when the file system that will hold `path`
    has less room than the checkpoint's files need (the run's state files, as they are now,
    and the weights as safetensors, the frozen ones in their dtype too); a save that still runs
    out midway is cleaned up."""
    need = sum(os.path.getsize(os.path.join(folder, name))
               for i, folder in enumerate(nvme)
               for name in _strata.store_state_files(i, len(nvme))
               if os.path.isfile(os.path.join(folder, name)))
    need += sum(4 * numel + 128 for _, tensors, _ in state._layout for *_, numel in tensors)
    for _, shape, dtype, _ in frozen_weights(state):  # model.safetensors holds them too
        need += math.prod(shape) * torch.empty((), dtype=dtype).element_size() + 128
    where = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(where):  # makedirs creates what is missing
        where = os.path.dirname(where)
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise Error(f"{what}: the file system of {where} has {free} bytes free, and the "
                    f"checkpoint needs about {need}; free some space there or save elsewhere "
                    "(nothing was written)")


def load_checkpoint(model, path, optimizer=None, lr_scheduler=None):
    """Continues the run saved by save_checkpoint in `path`: the engine's NVMe folders get the
    checkpoint's committed state and the engine reopens there (resumed_step is its step); the
    optimizer's param_groups, the scheduler's state and torch's RNG state are restored.
    Returns the client_state given to save_checkpoint."""
    state = _offloaded_state(model, "load_checkpoint")
    path = _checkpoint_path(path, "load_checkpoint")
    from ._checkpoint_shards import load_shards, saved_as_shards  # they import this module
    if state.core().world_size != 1 or saved_as_shards(path):
        return load_shards(state, path, optimizer, lr_scheduler)
    nvme = _closed_engine(state, "load_checkpoint")
    _finish_interrupted_replace(path)
    try:
        saved = _torch_load(os.path.join(path, "python.pt"))
    except FileNotFoundError as e:
        raise Error(f"{path} is not a strata checkpoint (no python.pt): {e}") from None
    if "folders" not in saved:
        raise Error(f"the checkpoint {path} was saved by {saved.get('world_size')} ranks; load "
                    "it with as many (each loads its own shard)")
    if saved["folders"] != len(nvme):
        raise Error(f"the checkpoint {path} holds {saved['folders']} NVMe folders' state, the "
                    f"engine has {len(nvme)}; give strata.Engine(nvme=...) as many folders")

    _check_fits(state, path, saved)

    def probe_then_copy():
        _probe(state, path, len(nvme), saved["step"])  # the run's own files are untouched
        copy_state_in(path, nvme, f"load_checkpoint({path!r})")

    _reopened(state, "loading a checkpoint", probe_then_copy)
    if state.core().resumed_step() != saved["step"]:
        raise Error(f"the engine reopened at step {state.core().resumed_step()}, the checkpoint "
                    f"{path} is step {saved['step']}: its NVMe state is damaged")
    _restore_python_state(state, saved, optimizer, lr_scheduler)
    torch.set_rng_state(saved["rng"])
    state.step_offset = saved.get("step_offset", 0)
    return saved["client_state"]


def _check_fits(state, path, saved):
    """strata.Error unless the checkpoint at `path` is one this model can continue from: its
    step agrees in strata.json, python.pt and its store's manifest, and its model.safetensors
    fits the model (_check_shapes). Reads the checkpoint only."""
    meta = _checkpoint_meta(path)
    if meta.get("step") != saved["step"]:
        raise Error(f"the checkpoint {path} is inconsistent: strata.json says step "
                    f"{meta.get('step')}, python.pt step {saved['step']}; nothing was changed")
    try:
        committed = _strata.peek_committed_step(os.path.join(path, "nvme0"))
    except Error as e:
        raise Error(f"the checkpoint {path} cannot be loaded: {e}; nothing was changed") from None
    if committed != saved["step"]:
        raise Error(f"the checkpoint {path} is inconsistent: its nvme0/ state is step "
                    f"{committed}, python.pt step {saved['step']}; nothing was changed")
    check_digests(path, saved.get("files", {}))  # a checkpoint saved before: none recorded
    _check_shapes(state, path)


def _check_shapes(state, path):
    """strata.Error unless the model.safetensors of the checkpoint at `path` names every weight
    of the model with the model's shape and nothing else (another number of layers, another
    width): the error names the tensor, its shape in the file and here, and the file. Reads
    the file's header only."""
    file = os.path.join(path, "model.safetensors")
    theirs = _safetensors_shapes(file)
    ours = {}
    for b, (bname, ps) in enumerate(state.engine_blocks()):
        for t, (n, _) in enumerate(ps):
            full = n if bname == "rest" else (f"{bname}.{n}" if bname else n)
            ours[full] = list(state._layout[b][1][t][1])
    # The frozen weights (a PEFT base): checked where the file holds them (one saved before
    # save_safetensors wrote them holds the trained ones alone).
    frozen = {n: list(shape) for n, shape, _, _ in frozen_weights(state)}
    diff = [f"{n} is {theirs[n]} there, {want[n]} here"
            for want in (ours, frozen) for n in sorted(want)
            if n in theirs and theirs[n] != want[n]]
    diff += [f"{n} is missing there" for n in sorted(set(ours) - set(theirs))]
    diff += [f"{n} is not in this model" for n in sorted(set(theirs) - set(ours) - set(frozen))]
    if diff:
        more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
        raise Error(f"the checkpoint {path} does not fit this model (another number of layers "
                    f"or another width?): in {file}, {'; '.join(diff[:3])}{more}; nothing was "
                    "changed")


def _safetensors_shapes(path):
    """{name: shape} from the header of the safetensors file at `path`."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except FileNotFoundError:
        raise Error(f"the checkpoint {path} is incomplete: no such file") from None
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise Error(f"the checkpoint's {path} is damaged ({e}); nothing was changed") from None


def _probe(state, path, folders, step):
    """Opens the checkpoint's own state (path/nvme<i>/) as the closed engine would resume it,
    with the engine's configuration, and closes it again: the engine's own checks (every
    block's state present with its size, so another state_dtype or placement; the manifest's
    checksum and each extent's, where the open reads it) run on the checkpoint before any byte
    of the run's state changes. strata.Error naming the checkpoint when it does not open there
    or opens at another step. Leaves nothing behind in the checkpoint (the store's lock is
    removed again when the probe made it)."""
    config = _strata.EngineConfig()
    for k in dir(config):
        if not k.startswith("_"):
            setattr(config, k, getattr(state.engine.config, k))
    config.nvme = [os.path.join(path, f"nvme{i}") for i in range(folders)]
    for f in config.nvme:
        if not os.path.isdir(f):
            raise Error(f"the checkpoint {path} is incomplete: it has no {os.path.basename(f)}/; "
                        "nothing was changed")
    config.resume, config.trace_path = True, ""
    made = [os.path.join(f, n) for f in config.nvme for n in os.listdir(f)]
    try:
        core = _strata.Engine(state._specs, config)
        try:
            got = core.resumed_step()
        finally:
            core.close()
    except Error as e:
        raise Error(f"the checkpoint {path} does not fit this engine (another model, "
                    f"state_dtype or placement, or damaged): {e}; nothing was changed") from None
    finally:
        for f in config.nvme:
            for n in os.listdir(f):
                if os.path.join(f, n) not in made and os.path.isfile(os.path.join(f, n)):
                    os.remove(os.path.join(f, n))
    if got != step:
        raise Error(f"the checkpoint {path} opened at step {got}, its python.pt is step {step}: "
                    "its NVMe state is damaged; nothing was changed")


def save_safetensors(model, path):
    """Writes the model's current weights as a safetensors file; for an offloaded model the
    trained ones (fp32) are gathered from the engine and its frozen ones (a PEFT base, in their
    dtype) read from where they lie, one tensor at a time as the file is written, so the file
    holds the whole model and memory one tensor of it. With several ranks every rank calls it
    (the gathers are collectives) and writes `path`. Tied parameters are written once."""
    state = None
    for p in model.parameters():
        state = getattr(p, "_strata_offload", None)
        break
    if state is not None:  # every rank writes `path`, one gathered tensor at a time
        return _write_gathered_safetensors(state, path, writer=True)
    _write_safetensors({n: p.detach().to("cpu", torch.float32).contiguous()
                        for n, p in model.named_parameters()}, path)


def _write_gathered_safetensors(state, path, writer):
    """The whole model (its frozen weights too) as the safetensors file _write_safetensors writes,
    its trained weights gathered one tensor at a time from the ranks' shards (no rank holds the
    whole model): every rank calls it (each gather is a collective, in sorted-name order on every
    rank) and only a `writer` rank keeps a file. A failure on one rank (its write, or a gather
    that fails there) does not stop its gathers, which the other ranks wait for: every rank goes
    through all of them and raises the first failure after the last."""
    entries = sorted((name, b, t) for b, t, name in state._where.values())
    gathered = set()

    def gather(name, b, t):
        gathered.add(name)
        return state._read_fp32(b, t)

    failure = None
    try:
        if writer:
            tensors = {name: (state._layout[b][1][t][1], torch.float32,
                              functools.partial(gather, name, b, t)) for name, b, t in entries}
            tensors.update(_frozen_entries(state))
            _write_safetensors(tensors, path)
    except Exception as e:  # noqa: BLE001 (raised below, once the gathers are done)
        failure = e
    for name, b, t in entries:  # the gathers the writer did not reach (or every one)
        if name not in gathered:
            try:
                gather(name, b, t)
            except Exception as e:  # noqa: BLE001 (the first one is raised below)
                failure = failure or e
    if failure is not None:
        raise failure


def _frozen_entries(state):
    """{name: (shape, dtype, read)} of the offloaded model's frozen weights (_write_safetensors
    reads each when it writes it)."""
    return {n: (shape, dtype, read) for n, shape, dtype, read in frozen_weights(state)}


_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}


def _write_safetensors(tensors, path):
    """{name: fp32 CPU tensor, or (shape, dtype, read) whose read() gives it when it is
    written} as a safetensors file at `path`, written atomically."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name]
        shape, dtype = (t[0], t[1]) if isinstance(t, tuple) else (t.shape, t.dtype)
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        blobs.append(t)
        offset += nbytes
    # {"format": "pt"}, as transformers' save_pretrained and the CLI's writer put it: the
    # from_pretrained of transformers < 4.49 reads the file's metadata without a None check.
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    # The CLI's writer (include/strata/atomic_file.h): a temporary created O_EXCL|O_NOFOLLOW next
    # to `path`, fsynced and renamed over it, so `path` holds the old file or the whole new one
    # and nothing planted at a predictable name is followed; removed again on any failure.
    f = _strata.AtomicFile(os.fspath(path))
    try:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in blobs:
            t = (t[2]() if isinstance(t, tuple) else t).contiguous()
            f.write_from(t.data_ptr(), t.numel() * t.element_size())
            del t
        f.commit()
    finally:
        f.discard()
