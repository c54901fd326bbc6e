"""save_checkpoint / load_checkpoint with several ranks, and a multi-rank checkpoint loaded on
another number of ranks (one included): each rank's shard of every block's states (rank<r>.pt),
read from and written into the open engine between steps. The checkpoint's layout and the ranks'
agreement after each phase are described in _checkpoint.py's docstring; every function here
that takes a core is a collective (every rank calls it, in the same order)."""
import json
import os
import shutil

import torch

from ._checkpoint import (_agree, _check_replaceable, _check_shapes, _check_step_goes_on,
                          _checkpoint_meta, _finish_interrupted_replace, _frozen_entries,
                          _holds_only_a_checkpoint,
                          _moments_access, _python_state, _ready_between_steps, _remove_leftover,
                          _replace_folder, _restore_python_state, _torch_load,
                          _write_gathered_safetensors)
from ._strata import Error


def save_shards(model, state, path, optimizer, lr_scheduler, client_state):
    """save_checkpoint with several ranks (every rank calls it): see the module docstring."""
    core = state.core()
    _ready_between_steps(state, "save_checkpoint")
    core.flush()  # the last step's pending updates run and it commits
    state.engine._take()
    steps, _ = _moments_access(state, "save_checkpoint")
    step = steps + state.step_offset
    rank, world = core.rank, core.world_size
    tmp = path + ".partial"
    what = f"save_checkpoint({path!r})"

    def make_folder():
        if rank == 0:
            _finish_interrupted_replace(path)
            _check_replaceable(path)
            _remove_leftover(path + ".old")
            _remove_leftover(tmp)
            os.makedirs(tmp)

    def write_shard():
        shards = {}
        for b, (_, _, padded) in enumerate(state._layout):
            for k in ("master", "exp_avg", "exp_avg_sq"):
                v = torch.empty(padded // world, dtype=torch.float32)
                core.read_component(b, k, v.data_ptr(), v.numel())
                shards[(b, k)] = v
        torch.save({"rank": rank, "world_size": world, "step": step, "shards": shards,
                    "rng": torch.get_rng_state()}, os.path.join(tmp, f"rank{rank}.pt"))

    def write_weights():
        if rank == 0:
            opt = optimizer or state._opt
            torch.save(_python_state(state, opt, lr_scheduler, client_state, step,
                                     world_size=world), os.path.join(tmp, "python.pt"))

    def put_in_place():
        if rank == 0:
            with open(os.path.join(tmp, "strata.json"), "w") as f:
                json.dump({"step": step, "world_size": world, "format": "shards"}, f)
            _replace_folder(tmp, path)

    try:
        _agree(core, what, make_folder)
        _agree(core, what, write_shard)  # every rank's shard is written
        # Tensor by tensor (a collective each): rank 0 writes each as it arrives, so no
        # rank ever holds more than one tensor of the whole model.
        _agree(core, what, lambda: _write_gathered_safetensors(
            state, os.path.join(tmp, "model.safetensors"), rank == 0))
        _agree(core, what, write_weights)
        _agree(core, what, put_in_place)  # no rank returns before the checkpoint is in place
    except BaseException:
        if rank == 0 and _holds_only_a_checkpoint(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_shards(state, path, optimizer, lr_scheduler):
    """load_checkpoint with several ranks (every rank calls it): see the module docstring."""
    core = state.core()
    _ready_between_steps(state, "load_checkpoint")
    rank, world = core.rank, core.world_size
    what = f"load_checkpoint({path!r})"
    loaded = {}
    _agree(core, what, lambda: rank == 0 and _finish_interrupted_replace(path))

    def read_shard():
        meta = _checkpoint_meta(path)
        if meta.get("format") != "shards":
            raise Error(f"the checkpoint {path} was saved by 1 rank, this run has {world}; "
                        "load it with 1 rank (its state is a copy of that rank's store)")
        # Another model's shards would be cut or padded to this one's sizes when re-sharded
        # (and may have this one's sizes when not): its weights' names and shapes say.
        _check_shapes(state, path)
        try:
            if meta.get("world_size") == world:
                loaded["mine"] = _torch_load(os.path.join(path, f"rank{rank}.pt"))
            else:
                loaded["mine"] = _resharded(state, path, int(meta["world_size"]), rank, world)
            loaded["saved"] = _torch_load(os.path.join(path, "python.pt"))
        except FileNotFoundError as e:
            raise Error(f"the checkpoint {path} is incomplete: {e}") from None
        except Exception as e:  # noqa: BLE001 (a damaged file: torch's unpickling errors vary)
            raise Error(f"the checkpoint {path} cannot be read on rank {rank}: {e}") from None
        steps, _ = _moments_access(state, "load_checkpoint")
        _check_step_goes_on(state, steps, int(loaded["saved"]["step"]), what)
        shards = loaded["mine"]["shards"]
        for b, (name, _, padded) in enumerate(state._layout):
            for k in ("master", "exp_avg", "exp_avg_sq"):
                v = shards.get((b, k))
                if v is None or v.numel() != padded // world:
                    raise Error(f"the checkpoint {path} does not fit this model: rank {rank}'s "
                                f"{k} of block {name!r} has {None if v is None else v.numel()} "
                                f"values, the engine's shard {padded // world}")

    # Every rank's shard is read and checked before any engine is written.
    _agree(core, what, read_shard)
    mine, saved = loaded["mine"], loaded["saved"]
    for (b, k), v in sorted(mine["shards"].items()):
        v = v.contiguous()
        core.write_component(b, k, v.data_ptr(), v.numel())  # committed with the next step
    state.components_written()
    steps, _ = _moments_access(state, "load_checkpoint")
    state.step_offset = int(saved["step"]) - steps
    _restore_python_state(state, saved, optimizer, lr_scheduler)
    torch.set_rng_state(mine["rng"])
    _agree(core, what, lambda: None)  # every rank has its shard back
    return saved["client_state"]


def _resharded(state, path, saved_world, rank, world):
    """Rank `rank` of `world`'s shards of every block's states from a checkpoint saved by
    `saved_world` ranks, as rank<r>.pt would hold them: each saved rank's file whose shard meets
    this rank's is read in turn (one at a time) and the overlap copied; values past the saved
    padding are the new padding (zeros). The RNG state is rank (rank % saved_world)'s."""
    out = {"rank": rank, "world_size": world, "shards": {}}
    for b, (_, _, padded) in enumerate(state._layout):
        for k in ("master", "exp_avg", "exp_avg_sq"):
            out["shards"][(b, k)] = torch.zeros(padded // world, dtype=torch.float32)
    for q in range(saved_world):
        old = None
        for b, (name, _, padded) in enumerate(state._layout):
            n = padded // world
            lo_new = rank * n
            for k in ("master", "exp_avg", "exp_avg_sq"):
                if old is None:
                    old = _torch_load(os.path.join(path, f"rank{q}.pt"))
                v = old["shards"].get((b, k))
                if v is None:
                    raise Error(f"the checkpoint {path} does not fit this model: rank {q}'s file "
                                f"has no {k} of block {name!r}")
                m = v.numel()  # the saved shard
                lo, hi = max(lo_new, q * m), min(lo_new + n, (q + 1) * m)
                if lo < hi:
                    out["shards"][(b, k)][lo - lo_new:hi - lo_new] = v[lo - q * m:hi - q * m]
        if q == rank % saved_world:
            out["rng"] = old["rng"]
        out["step"] = old["step"]
        del old
    return out


def saved_as_shards(path):
    """Whether `path` holds a multi-rank checkpoint (one rank loads it re-sharded); a replace
    cut short between its renames is finished first, as every load does."""
    _finish_interrupted_replace(path)
    if not os.path.isfile(os.path.join(path, "strata.json")):
        return False  # no checkpoint, or not a whole one: the single-rank load says which
    return _checkpoint_meta(path).get("format") == "shards"  # damaged: strata.Error naming it
