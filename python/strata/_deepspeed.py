"""strata.initialize: DeepSpeed's entry point for a script written for ZeRO-3 offload.

    engine, optimizer, _, lr_scheduler = strata.initialize(model=model, config=ds_config)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(folder)

is the same script as with `deepspeed.initialize`: the model is offloaded (strata.offload) into a
strata.Engine built from the ZeRO-3 offload subset of the config, with strata.optim.AdamW and,
when the config names one, DeepSpeed's WarmupLR or WarmupDecayLR schedule (step for step as
DeepSpeed's). Each config key is mapped, ignored with a warning naming it (tuning knobs of
DeepSpeed's own machinery, which the engine's planner decides), or refused with strata.Error
(anything else: what strata would compute differently); _ds_config.py checks the whole config
before the model is touched. The mapping is documented in python/README.md.
"""
import math
import os
import warnings

import torch

from . import optim
from ._checkpoint import load_checkpoint, save_checkpoint
from ._ds_config import resolve
from ._offload import Engine, offload
from ._strata import Error

__all__ = ["initialize", "DeepSpeedEngine", "WarmupLR", "WarmupDecayLR"]

def initialize(model=None, config=None, model_parameters=None, optimizer=None,
               lr_scheduler=None, blocks=None, recompute=True, offload_activations="auto",
               activation_bytes=None, **engine_options):
    """DeepSpeed's initialize: returns (engine, optimizer, None, lr_scheduler).

    `blocks`: the model's repeated sub-modules (default: its largest nn.ModuleList of one
    module type, e.g. GPT2's transformer.h). `recompute`, `offload_activations`,
    `activation_bytes`: strata.offload's. `engine_options`: strata.Engine's own (device_mem,
    host_mem, ...), which a DeepSpeed config does not say. The whole config is checked
    (_ds_config.resolve) and the engine built before the model is offloaded: a config that is
    refused leaves the model as it was, so that a retry with the config fixed works."""
    if model is None or config is None:
        raise Error("strata.initialize(model=..., config=...): both are required")
    if optimizer is not None or lr_scheduler is not None:
        raise Error("strata.initialize takes the optimizer and scheduler from the config "
                    "(\"optimizer\", \"scheduler\"); a client optimizer or scheduler object is "
                    "not supported (the engine runs AdamW itself)")
    world = int(torch.distributed.get_world_size()) if (
        torch.distributed.is_available() and torch.distributed.is_initialized()) else 1
    c = resolve(config, world)
    if c.nvme and engine_options.get("nvme"):
        raise Error(f"nvme={engine_options['nvme']!r} and the config's nvme_path {c.nvme}: give "
                    "the NVMe folders in one place")
    groups = list(model_parameters) if model_parameters is not None else None
    _check_per_group(c.scheduler, len(groups) if groups and isinstance(groups[0], dict) else 1)
    if blocks is None:
        blocks = _find_blocks(model)
    engine = Engine(**{"nvme": c.nvme or None, **engine_options})
    offload(model, blocks=blocks, engine=engine, micro_batches=c.micro, recompute=recompute,
            offload_activations=offload_activations, activation_bytes=activation_bytes)
    opt = optim.AdamW(groups if groups is not None else model.parameters(),
                      max_grad_norm=c.clip, **c.optimizer)
    sched = None
    if c.scheduler is not None:
        kind, params = c.scheduler
        sched = (WarmupDecayLR if kind == "WarmupDecayLR" else WarmupLR)(opt, **params)
    if c.ignored:
        warnings.warn(f"strata.initialize ignores these DeepSpeed config keys (the engine's "
                      f"planner decides what they tune): {c.ignored}", stacklevel=2)
    ds = DeepSpeedEngine(model, engine, opt, sched, c.micro, c.ignored)
    return ds, opt, None, sched


def _check_per_group(scheduler, groups):
    """A warmup_min_lr or warmup_max_lr given per param group needs one value per group."""
    if scheduler is None:
        return
    for k in ("warmup_min_lr", "warmup_max_lr"):
        v = scheduler[1].get(k)
        if isinstance(v, list) and len(v) != groups:
            raise Error(f"DeepSpeed config scheduler.params.{k}={v!r}: expected one number, or "
                        f"one per param group ({groups})")


def _find_blocks(model):
    """The model's largest nn.ModuleList whose modules are all of one type."""
    best, size = None, 0
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and len(
                {type(c) for c in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            if n > size:
                best, size = m, n
    if best is None:
        raise Error("strata.initialize found no repeated blocks (an nn.ModuleList of one module "
                    "type) in the model; pass blocks=[...] (its repeated sub-modules, in "
                    "forward order)")
    return list(best)


class WarmupLR:
    """DeepSpeed's WarmupLR, step for step: the lr rises from warmup_min_lr to warmup_max_lr
    over warmup_num_steps (log or linear), then stays. As DeepSpeed's, the constructor sets
    every param group's lr to warmup_min_lr and leaves last_batch_iteration at -1, so the first
    optimizer step runs at warmup_min_lr and the first step() sets iteration 0's lr (which is
    warmup_min_lr again): the lr of optimizer step k >= 2 is that of iteration k - 2.
    warmup_min_lr and warmup_max_lr may be one number or one per param group; warmup_max_lr's
    default is DeepSpeed's, 0.001."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type="log", last_batch_iteration=-1):
        if warmup_type not in ("log", "linear"):
            raise Error(f"scheduler warmup_type={warmup_type!r}: expected log or linear")
        self.optimizer = optimizer
        self.min_lrs = self._per_group(warmup_min_lr, "warmup_min_lr")
        self.max_lrs = self._per_group(warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = warmup_type
        self.last_batch_iteration = int(last_batch_iteration)
        if self.last_batch_iteration == -1:
            self._set(self.get_lr())

    def _per_group(self, value, name):
        n = len(self.optimizer.param_groups)
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise Error(f"scheduler {name}={list(value)}: expected one value per param "
                            f"group ({n})")
            return [float(v) for v in value]
        return [float(value)] * n

    def _gamma(self):
        it = self.last_batch_iteration
        if it < self.warmup_num_steps:
            if self.warmup_type == "log":
                return math.log(it + 1) / math.log(self.warmup_num_steps)
            return it / self.warmup_num_steps
        return 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        g = self._gamma()
        return [lo + (hi - lo) * g for lo, hi in zip(self.min_lrs, self.max_lrs)]

    def _set(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr

    def step(self, last_batch_iteration=None):
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else int(last_batch_iteration))
        self._set(self.get_lr())

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        """As DeepSpeed's: the iteration only; the lr comes back with the optimizer's
        param_groups (load_checkpoint restores both)."""
        self.last_batch_iteration = int(sd["last_batch_iteration"])


class WarmupDecayLR(WarmupLR):
    """DeepSpeed's WarmupDecayLR: WarmupLR's warmup, then the lr falls linearly to 0 at
    total_num_steps (iterations as in WarmupLR)."""

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type="log", last_batch_iteration=-1):
        self.total_num_steps = int(total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)

    def _gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return super()._gamma()
        return max(0.0, (self.total_num_steps - self.last_batch_iteration)
                   / max(1.0, self.total_num_steps - self.warmup_num_steps))


class DeepSpeedEngine:
    """What deepspeed.initialize returns, over an offloaded model: call it for forward, then
    backward(loss) and step() every micro-batch; the update runs at each
    gradient_accumulation_steps boundary."""

    def __init__(self, module, engine, optimizer, lr_scheduler, micro, ignored):
        self.module, self.strata_engine = module, engine
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self._micro_steps = micro
        self.ignored_config_keys = ignored
        self.micro_steps = 0
        self.global_steps = 0

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    def gradient_accumulation_steps(self):
        return self._micro_steps

    def is_gradient_accumulation_boundary(self):
        return (self.micro_steps + 1) % self._micro_steps == 0

    def backward(self, loss):
        """loss.backward() of the loss scaled by 1 / gradient_accumulation_steps, as
        DeepSpeed's backward does."""
        (loss / self._micro_steps if self._micro_steps > 1 else loss).backward()
        return loss

    def step(self):
        """At the accumulation boundary: the optimizer step (the engine's AdamW, clipped) and
        the scheduler's; otherwise nothing."""
        if self.is_gradient_accumulation_boundary():
            self.optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.global_steps += 1
        self.micro_steps += 1

    def zero_grad(self):
        pass  # the engine clears the gradients after each update

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        self.module.eval()
        return self

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def save_checkpoint(self, save_dir, tag=None, client_state=None):
        """strata.save_checkpoint into save_dir/tag (tag: "global_step<N>" by default), and
        save_dir/latest naming it, as DeepSpeed lays a checkpoint out."""
        tag = tag or f"global_step{self.global_steps}"
        os.makedirs(save_dir, exist_ok=True)
        state = dict(client_state or {})
        state["_strata_global_steps"] = self.global_steps
        save_checkpoint(self.module, os.path.join(save_dir, str(tag)), self.optimizer,
                        self.lr_scheduler, state)
        if self.strata_engine.rank == 0:  # with several ranks every one calls this
            with open(os.path.join(save_dir, "latest"), "w") as f:
                f.write(str(tag))
        return True

    def load_checkpoint(self, load_dir, tag=None, load_optimizer_states=True,
                        load_lr_scheduler_states=True):
        """(path, client_state), as DeepSpeed returns them; without a tag and without
        load_dir/latest, (None, None) and a warning, as DeepSpeed does (a script that resumes
        when a checkpoint exists starts afresh otherwise)."""
        if not load_optimizer_states:
            raise Error("load_checkpoint(load_optimizer_states=False) is not supported: the "
                        "engine's checkpoint is its whole committed state")
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                warnings.warn(f"load_checkpoint: no {latest}, so no checkpoint to load (pass "
                              "tag= to load one by name); the run starts afresh", stacklevel=2)
                return None, None
            with open(latest) as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, str(tag))
        state = load_checkpoint(self.module, path, self.optimizer,
                                self.lr_scheduler if load_lr_scheduler_states else None)
        self.global_steps = state.pop("_strata_global_steps")
        self.micro_steps = self.global_steps * self._micro_steps
        return path, state
