"""strata.initialize: DeepSpeed's entry point for a script written for ZeRO-3 offload.

    engine, optimizer, _, lr_scheduler = strata.initialize(model=model, config=ds_config)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(folder)

is the same script as with `deepspeed.initialize`: the model is offloaded (strata.offload) into a
strata.Engine built from the ZeRO-3 offload subset of the config, with strata.optim.AdamW and,
when the config names one, DeepSpeed's WarmupLR or WarmupDecayLR schedule. Each config key is
mapped (_MAPPED), ignored with a warning naming it (_IGNORED: tuning knobs of DeepSpeed's own
machinery, which the engine's planner decides), or refused with strata.Error (anything else:
what strata would compute differently). The mapping is documented in python/README.md.
"""
import math
import os
import warnings

import torch

from . import optim
from ._checkpoint import load_checkpoint, save_checkpoint
from ._offload import Engine, offload
from ._strata import Error

__all__ = ["initialize", "DeepSpeedEngine"]

# zero_optimization keys the engine's planner decides itself (buffers, buckets, prefetch).
_IGNORED_ZERO = {
    "contiguous_gradients", "overlap_comm", "reduce_bucket_size", "reduce_scatter",
    "allgather_bucket_size", "allgather_partitions", "round_robin_gradients", "sub_group_size",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "memory_efficient_linear", "elastic_checkpoint", "load_from_fp32_weights",
}
_IGNORED_OFFLOAD = {"pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "fast_init",
                    "ratio", "pipeline_read", "pipeline_write", "pipeline"}
_IGNORED_TOP = {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
                "dump_state", "prescale_gradients", "gradient_predivide_factor",
                "memory_breakdown", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
                "comms_logger", "aio", "activation_checkpointing"}
_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "optimizer", "scheduler", "zero_optimization", "fp16", "bf16",
        "amp"} | _IGNORED_TOP


def initialize(model=None, config=None, model_parameters=None, optimizer=None,
               lr_scheduler=None, blocks=None, recompute=True, offload_activations="auto",
               activation_bytes=None, **engine_options):
    """DeepSpeed's initialize: returns (engine, optimizer, None, lr_scheduler).

    `blocks`: the model's repeated sub-modules (default: its largest nn.ModuleList of one
    module type, e.g. GPT2's transformer.h). `recompute`, `offload_activations`,
    `activation_bytes`: strata.offload's. `engine_options`: strata.Engine's own (device_mem,
    host_mem, ...), which a DeepSpeed config does not say."""
    if model is None or config is None:
        raise Error("strata.initialize(model=..., config=...): both are required")
    if optimizer is not None or lr_scheduler is not None:
        raise Error("strata.initialize takes the optimizer and scheduler from the config "
                    "(\"optimizer\", \"scheduler\"); a client optimizer or scheduler object is "
                    "not supported (the engine runs AdamW itself)")
    if not isinstance(config, dict):
        raise Error(f"config must be a dict (a DeepSpeed config), got {type(config).__name__}")
    ignored = []
    unknown = sorted(set(config) - _TOP)
    if unknown:
        raise Error(f"DeepSpeed config keys not supported by strata.initialize: {unknown}")
    ignored += sorted(k for k in config if k in _IGNORED_TOP)
    _refuse_precision(config)
    micro = int(config.get("gradient_accumulation_steps", 1))
    _check_batch(config, micro)
    nvme, zero_ignored = _zero(config.get("zero_optimization"))
    ignored += zero_ignored
    if nvme and engine_options.get("nvme"):
        raise Error(f"nvme={engine_options['nvme']!r} and the config's nvme_path {nvme}: give "
                    "the NVMe folders in one place")
    engine = Engine(**{"nvme": nvme or None, **engine_options})
    if blocks is None:
        blocks = _find_blocks(model)
    offload(model, blocks=blocks, engine=engine, micro_batches=micro, recompute=recompute,
            offload_activations=offload_activations, activation_bytes=activation_bytes)
    opt = _optimizer(model, model_parameters, config.get("optimizer"),
                     float(config.get("gradient_clipping", 0.0)))
    sched = _scheduler(opt, config.get("scheduler"))
    if ignored:
        warnings.warn(f"strata.initialize ignores these DeepSpeed config keys (the engine's "
                      f"planner decides what they tune): {ignored}", stacklevel=2)
    ds = DeepSpeedEngine(model, engine, opt, sched, micro, ignored)
    return ds, opt, None, sched


def _refuse_precision(config):
    if config.get("fp16", {}).get("enabled", False):
        raise Error("config fp16.enabled: strata trains fp32 master weights without loss "
                    "scaling; use bf16 (torch.autocast) or remove fp16")
    if config.get("amp", {}).get("enabled", False):
        raise Error("config amp.enabled: apex AMP is not supported; use torch.autocast")
    if config.get("bf16", {}).get("enabled", False):
        extra = set(config["bf16"]) - {"enabled"}
        if extra:
            raise Error(f"config bf16 keys {sorted(extra)} are not supported")
        # bf16: the engine already computes in bf16 on CUDA (fp32 master weights, as
        # DeepSpeed's bf16 mode keeps); on the host device it computes in fp32.


def _check_batch(config, micro):
    mb = config.get("train_micro_batch_size_per_gpu")
    tb = config.get("train_batch_size")
    if micro < 1:
        raise Error(f"gradient_accumulation_steps={micro}: must be >= 1")
    if mb is not None and tb is not None:
        world = int(torch.distributed.get_world_size()) if (
            torch.distributed.is_available() and torch.distributed.is_initialized()) else 1
        if int(tb) != int(mb) * micro * world:
            raise Error(f"train_batch_size {tb} != train_micro_batch_size_per_gpu {mb} x "
                        f"gradient_accumulation_steps {micro} x world size {world}")


def _zero(zero):
    """(NVMe folders, ignored keys) of the zero_optimization section."""
    if zero is None:
        raise Error("the config has no zero_optimization section; strata.initialize takes "
                    "ZeRO stage 3 with offload_param / offload_optimizer")
    if int(zero.get("stage", 0)) != 3:
        raise Error(f"zero_optimization.stage={zero.get('stage')}: strata holds parameters "
                    "and optimizer states offloaded as ZeRO stage 3 does; set stage 3")
    ignored = [f"zero_optimization.{k}" for k in sorted(zero) if k in _IGNORED_ZERO]
    unknown = sorted(set(zero) - _IGNORED_ZERO - {"stage", "offload_param", "offload_optimizer"})
    if unknown:
        raise Error(f"zero_optimization keys not supported by strata.initialize: {unknown}")
    nvme = []
    for section in ("offload_param", "offload_optimizer"):
        off = zero.get(section) or {}
        bad = sorted(set(off) - _IGNORED_OFFLOAD - {"device", "nvme_path"})
        if bad:
            raise Error(f"zero_optimization.{section} keys not supported: {bad}")
        ignored += [f"zero_optimization.{section}.{k}" for k in sorted(off)
                    if k in _IGNORED_OFFLOAD]
        device = off.get("device", "none")
        if device not in ("none", "cpu", "nvme"):
            raise Error(f"zero_optimization.{section}.device={device!r}: expected none, cpu "
                        "or nvme")
        if device == "nvme":
            if not off.get("nvme_path"):
                raise Error(f"zero_optimization.{section}.device=nvme needs nvme_path")
            if off["nvme_path"] not in nvme:
                nvme.append(off["nvme_path"])
    return nvme, ignored


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


def _optimizer(model, model_parameters, spec, clip):
    if spec is None:
        raise Error("the config has no optimizer section; give {\"type\": \"AdamW\", "
                    "\"params\": {...}}")
    kind = spec.get("type", "")
    params = dict(spec.get("params", {}))
    if kind.lower() not in ("adam", "adamw"):
        raise Error(f"optimizer type {kind!r}: strata runs AdamW only (Adam, AdamW)")
    if kind.lower() == "adam" and not params.pop("adam_w_mode", True):
        raise Error("optimizer Adam with adam_w_mode=false (L2 regularisation) is not "
                    "supported; strata runs AdamW (decoupled weight decay)")
    params.pop("adam_w_mode", None)
    params.pop("torch_adam", None)
    bad = sorted(set(params) - {"lr", "betas", "eps", "weight_decay"})
    if bad:
        raise Error(f"optimizer params not supported: {bad}")
    groups = model_parameters if model_parameters is not None else model.parameters()
    return optim.AdamW(groups, max_grad_norm=clip, **params)


class _WarmupLR:
    """DeepSpeed's WarmupLR (and WarmupDecayLR with total_num_steps): the lr rises from
    warmup_min_lr to warmup_max_lr over warmup_num_steps (log or linear), then stays (or
    falls linearly to 0 at total_num_steps)."""

    def __init__(self, opt, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type="log", total_num_steps=None, last_batch_iteration=-1):
        if warmup_type not in ("log", "linear"):
            raise Error(f"scheduler warmup_type={warmup_type!r}: expected log or linear")
        self.optimizer = opt
        self.min_lr, self.max_lr = float(warmup_min_lr), float(warmup_max_lr)
        self.warmup = max(2, int(warmup_num_steps))
        self.type, self.total = warmup_type, total_num_steps
        self.last_batch_iteration = int(last_batch_iteration)
        self.step()

    def _gamma(self, it):
        if it < self.warmup:
            if self.type == "log":
                return math.log(it + 1) / math.log(self.warmup)
            return it / self.warmup
        if self.total is None:
            return 1.0
        return max(0.0, (self.total - it) / max(1.0, self.total - self.warmup))

    def get_lr(self):
        g = self._gamma(self.last_batch_iteration)
        return [self.min_lr + (self.max_lr - self.min_lr) * g for _ in self.optimizer.param_groups]

    def step(self, last_batch_iteration=None):
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else int(last_batch_iteration))
        for g, lr in zip(self.optimizer.param_groups, self.get_lr()):
            g["lr"] = lr

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        self.last_batch_iteration = sd["last_batch_iteration"]
        for g, lr in zip(self.optimizer.param_groups, self.get_lr()):
            g["lr"] = lr


def _scheduler(opt, spec):
    if spec is None:
        return None
    kind, params = spec.get("type"), dict(spec.get("params", {}))
    if kind not in ("WarmupLR", "WarmupDecayLR"):
        raise Error(f"scheduler type {kind!r}: strata.initialize has WarmupLR and "
                    "WarmupDecayLR; for another, drive the optimizer's lr with a torch scheduler")
    if kind == "WarmupDecayLR" and "total_num_steps" not in params:
        raise Error("scheduler WarmupDecayLR needs total_num_steps")
    try:
        return _WarmupLR(opt, **params)
    except TypeError as e:
        raise Error(f"scheduler {kind} params: {e}") from None


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
