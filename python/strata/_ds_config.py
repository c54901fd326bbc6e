"""The DeepSpeed config strata.initialize takes, checked whole before the model is touched.

resolve(config, world_size, engine_options) reads every key strata.initialize maps, checks its
type and range, resolves "auto" where the value is known, and returns what initialize needs (a
Resolved). Nothing is built, offloaded or changed: a config that fails raises strata.Error
naming the key (dotted, as "optimizer.params.betas"), the value given and what is accepted, and
the model is as it was, so a retry with the config fixed works.

"auto" (what HF's Trainer writes into a config for it to fill in) is resolved as HF's DeepSpeed
integration resolves it, where strata.initialize knows the value without a Trainer:
  scheduler.params.warmup_min_lr        0 (HF's value)
  scheduler.params.warmup_max_lr        optimizer.params.lr (HF gives both the learning rate)
  gradient_accumulation_steps           train_batch_size / (micro batch x world size)
  train_batch_size, train_micro_batch_size_per_gpu   not checked (the script's loader
                                        decides the batch; strata never needs these)
  fp16.enabled, amp.enabled             false (strata has no fp16 mode: HF without --fp16)
  bf16.enabled                          the engine's own choice (bf16 compute on CUDA)
  keys strata ignores                   ignored, whatever their value
and refused by name where the value is a TrainingArguments setting strata.initialize cannot know
(the optimizer's lr, betas, eps and weight_decay, gradient_clipping, warmup_num_steps,
total_num_steps).

strata.hf.Trainer's config goes through the same check (resolve_for_trainer): there every
"auto" takes the TrainingArguments' value, as transformers' DeepSpeed integration fills it in, a
number that disagrees with the arguments is refused by name (the Trainer builds its optimizer
from the arguments), the optimizer section may be left out, and a scheduler section is refused
(the arguments' lr_scheduler_type and warm-up drive the lr).
"""
import collections
import math
import os

from ._strata import Error

# zero_optimization keys the engine's planner decides itself (buffers, buckets, prefetch).
IGNORED_ZERO = {
    "contiguous_gradients", "overlap_comm", "reduce_bucket_size", "reduce_scatter",
    "allgather_bucket_size", "allgather_partitions", "round_robin_gradients", "sub_group_size",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "memory_efficient_linear", "elastic_checkpoint", "load_from_fp32_weights",
}
IGNORED_OFFLOAD = {"pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "fast_init",
                   "ratio", "pipeline_read", "pipeline_write", "pipeline"}
IGNORED_TOP = {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
               "dump_state", "prescale_gradients", "gradient_predivide_factor",
               "memory_breakdown", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
               "comms_logger", "aio", "activation_checkpointing"}
# fp16 keys that tune loss scaling: meaningless once fp16 is off (the only way strata runs).
_FP16_SCALING = {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                 "consecutive_hysteresis", "min_loss_scale", "auto_cast",
                 "fp16_master_weights_and_grads"}
TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
       "gradient_clipping", "optimizer", "scheduler", "zero_optimization", "fp16", "bf16",
       "amp"} | IGNORED_TOP
_OPT_PARAMS = {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"}
_SCHED_PARAMS = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                 "total_num_steps", "last_batch_iteration"}

Resolved = collections.namedtuple(
    "Resolved", "micro clip optimizer scheduler nvme ignored")
Resolved.__doc__ = """What initialize builds from a checked config: micro (gradient
accumulation steps), clip (max_grad_norm, 0 = none), optimizer (AdamW keyword arguments),
scheduler (None or (type, keyword arguments)), nvme (folders), ignored (dotted keys)."""

_AUTO = "auto"


def _refuse(key, value, accepted):
    raise Error(f"DeepSpeed config {key}={value!r}: expected {accepted}")


def _number(key, value, accepted="a finite number >= 0", low=0.0):
    """A finite float >= low; a bool, a string ("1e-3") or anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _refuse(key, value, accepted + (" (a number, not a string)" if isinstance(value, str)
                                        else ""))
    if not math.isfinite(value) or value < low:
        _refuse(key, value, accepted)
    return float(value)


def _integer(key, value, low, accepted=None):
    accepted = accepted or f"an integer >= {low}"
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _refuse(key, value, accepted + (" (a number, not a string)" if isinstance(value, str)
                                        else ""))
    return value


def _section(key, value, keys=None):
    """A section must be a dict (a JSON object); `keys`: the ones allowed in it."""
    if not isinstance(value, dict):
        _refuse(key, value, "a section (a dict such as {\"device\": \"cpu\"})"
                if key.startswith("zero_optimization.") else "a section (a dict)")
    for k in value:
        if not isinstance(k, str):
            _refuse(f"{key} key", k, "a string")
    if keys is not None:
        unknown = sorted(set(value) - keys)
        if unknown:
            raise Error(f"DeepSpeed config {key}: keys not supported by strata.initialize: "
                        f"{unknown} (supported: {sorted(keys)})")
    return value


def _unknown_auto(key):
    raise Error(f"DeepSpeed config {key}=\"auto\": strata.initialize has no TrainingArguments to "
                "take it from (HF's Trainer fills it in); give the value")


def resolve(config, world_size=1):
    """The checked config (a Resolved); strata.Error naming the first key that is wrong."""
    if not isinstance(config, dict):
        raise Error(f"config must be a dict (a DeepSpeed config), got {type(config).__name__}")
    for k in config:
        if not isinstance(k, str):
            _refuse("key", k, "a string")
    unknown = sorted(set(config) - TOP)
    if unknown:
        raise Error(f"DeepSpeed config keys not supported by strata.initialize: {unknown}")
    ignored = sorted(k for k in config if k in IGNORED_TOP)
    ignored += _precision(config)
    micro = _batch(config, world_size)
    clip = config.get("gradient_clipping", 0.0)
    if clip == _AUTO:
        _unknown_auto("gradient_clipping")
    clip = _number("gradient_clipping", clip, "a finite number >= 0 (0 = no clipping)")
    nvme, zero_ignored = _zero(config.get("zero_optimization"))
    optimizer = _optimizer(config.get("optimizer"))
    scheduler = _scheduler(config.get("scheduler"), optimizer)
    return Resolved(micro, clip, optimizer, scheduler, nvme, ignored + zero_ignored)


def resolve_for_trainer(config, args):
    """resolve() of strata.hf.Trainer's config dict, its "auto" values filled from the
    TrainingArguments `args`; strata.Error naming the first key that is wrong or that disagrees
    with the arguments."""
    if not isinstance(config, dict):
        raise Error(f"deepspeed_config must be a dict (a DeepSpeed config), got "
                    f"{type(config).__name__}")
    if "scheduler" in config:
        raise Error("deepspeed_config scheduler: strata.hf.Trainer drives the lr with the "
                    "TrainingArguments (lr_scheduler_type, warmup_steps, warmup_ratio); remove "
                    "the scheduler section and set those instead")
    world = max(int(getattr(args, "world_size", 1) or 1), 1)
    micro, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
    filled = dict(config)
    _fill(filled, "", {"train_micro_batch_size_per_gpu": micro,
                       "gradient_accumulation_steps": accum,
                       "train_batch_size": micro * accum * world,
                       "gradient_clipping": max(float(args.max_grad_norm or 0.0), 0.0)})
    opt = config.get("optimizer", {"type": "AdamW"})
    if isinstance(opt, dict) and isinstance(opt.get("params", {}), dict):
        opt = dict(opt, params=dict(opt.get("params", {})))
        _fill(opt["params"], "optimizer.params.",
              {"lr": args.learning_rate, "betas": [args.adam_beta1, args.adam_beta2],
               "eps": args.adam_epsilon, "weight_decay": args.weight_decay})
    filled["optimizer"] = opt
    return resolve(filled, world)


def _fill(section, prefix, values):
    """Sets each key of `values` given as "auto" in `section` to its value; a number given
    that disagrees with it is refused (its type is resolve()'s to check)."""
    for key, value in values.items():
        given = section.get(key, _AUTO)
        if given == _AUTO:
            section[key] = value
            continue
        numbers = given if isinstance(given, (list, tuple)) else [given]
        wanted = value if isinstance(value, list) else [value]
        if (len(numbers) == len(wanted)
                and all(isinstance(g, (int, float)) and not isinstance(g, bool) for g in numbers)
                and any(float(g) != float(w) for g, w in zip(numbers, wanted))):
            raise Error(f"deepspeed_config {prefix}{key}={given!r} disagrees with "
                        f"TrainingArguments ({value}); set it to \"auto\" or to the same value")


def _enabled(key, section):
    """The section's "enabled" (a bool; "auto" is None: the caller decides)."""
    enabled = section.get("enabled", False)
    if enabled == _AUTO:
        return None
    if not isinstance(enabled, bool):
        _refuse(f"{key}.enabled", enabled, "true, false or \"auto\"")
    return enabled


def _precision(config):
    ignored = []
    if "fp16" in config:
        fp16 = _section("fp16", config["fp16"], {"enabled"} | _FP16_SCALING)
        if _enabled("fp16", fp16):
            raise Error("DeepSpeed config fp16.enabled=True: strata trains fp32 master weights "
                        "without loss scaling; use bf16 (torch.autocast) or set it false")
        ignored += [f"fp16.{k}" for k in sorted(fp16) if k != "enabled"]
    if "amp" in config:
        amp = _section("amp", config["amp"])
        if _enabled("amp", amp):
            raise Error("DeepSpeed config amp.enabled=True: apex AMP is not supported; use "
                        "torch.autocast")
        ignored += [f"amp.{k}" for k in sorted(amp) if k != "enabled"]
    if "bf16" in config:
        # bf16: the engine already computes in bf16 on CUDA (fp32 master weights, as
        # DeepSpeed's bf16 mode keeps); on the host device it computes in fp32.
        _enabled("bf16", _section("bf16", config["bf16"], {"enabled"}))
    return ignored


def _batch(config, world):
    """gradient_accumulation_steps, checked against the two batch sizes where given."""
    sizes = {}
    for k in ("train_batch_size", "train_micro_batch_size_per_gpu"):
        v = config.get(k)
        if v is not None and v != _AUTO:
            sizes[k] = _integer(k, v, 1, "an integer >= 1 or \"auto\"")
    tb, mb = sizes.get("train_batch_size"), sizes.get("train_micro_batch_size_per_gpu")
    micro = config.get("gradient_accumulation_steps", 1)
    if micro == _AUTO:
        if tb is None or mb is None:
            raise Error("DeepSpeed config gradient_accumulation_steps=\"auto\": known only from "
                        "train_batch_size / (train_micro_batch_size_per_gpu x world size), and "
                        "they are not both given as numbers; give it as a number")
        if tb % (mb * world):
            raise Error(f"DeepSpeed config gradient_accumulation_steps=\"auto\": train_batch_size "
                        f"{tb} is not a multiple of train_micro_batch_size_per_gpu {mb} x world "
                        f"size {world}")
        return tb // (mb * world)
    micro = _integer("gradient_accumulation_steps", micro, 1, "an integer >= 1 or \"auto\"")
    if tb is not None and mb is not None and tb != mb * micro * world:
        raise Error(f"DeepSpeed config train_batch_size {tb} != train_micro_batch_size_per_gpu "
                    f"{mb} x gradient_accumulation_steps {micro} x world size {world}")
    return micro


def _zero(zero):
    """(NVMe folders, ignored keys) of the zero_optimization section."""
    if zero is None:
        raise Error("the config has no zero_optimization section; strata.initialize takes "
                    "ZeRO stage 3 with offload_param / offload_optimizer")
    _section("zero_optimization", zero,
             IGNORED_ZERO | {"stage", "offload_param", "offload_optimizer"})
    stage = zero.get("stage", 0)  # DeepSpeed's default: 0
    if isinstance(stage, bool) or not isinstance(stage, int) or stage != 3:
        raise Error(f"DeepSpeed config zero_optimization.stage={stage!r}"
                    f"{'' if 'stage' in zero else ' (not given: DeepSpeed takes 0)'}: expected 3 "
                    "(strata holds parameters and optimizer states offloaded as ZeRO stage 3 "
                    "does)")
    ignored = [f"zero_optimization.{k}" for k in sorted(zero) if k in IGNORED_ZERO]
    nvme = []
    for name in ("offload_param", "offload_optimizer"):
        key = f"zero_optimization.{name}"
        off = zero.get(name)
        if off is None:
            continue
        _section(key, off, IGNORED_OFFLOAD | {"device", "nvme_path"})
        ignored += [f"{key}.{k}" for k in sorted(off) if k in IGNORED_OFFLOAD]
        device = off.get("device", "none")
        if device not in ("none", "cpu", "nvme"):
            _refuse(f"{key}.device", device, "\"none\", \"cpu\" or \"nvme\"")
        if device != "nvme":
            continue
        path = off.get("nvme_path")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            _refuse(f"{key}.nvme_path", path, "the folder (a path) to offload to, with "
                    "device \"nvme\"")
        path = os.fspath(path)
        if not os.path.isdir(path):
            _refuse(f"{key}.nvme_path", path, "an existing folder (create it first: one per "
                    "drive)")
        if path not in nvme:
            nvme.append(path)
    return nvme, ignored


def _optimizer(spec):
    """AdamW's keyword arguments."""
    if spec is None:
        raise Error("the config has no optimizer section; give {\"type\": \"AdamW\", "
                    "\"params\": {...}}")
    _section("optimizer", spec, {"type", "params"})
    kind = spec.get("type")
    if not isinstance(kind, str) or kind.lower() not in ("adam", "adamw"):
        _refuse("optimizer.type", kind, "\"AdamW\" or \"Adam\" (strata runs AdamW only)")
    params = _section("optimizer.params", spec.get("params", {}), _OPT_PARAMS)
    for k in ("adam_w_mode", "torch_adam"):
        if k in params and not isinstance(params[k], bool):
            _refuse(f"optimizer.params.{k}", params[k], "true or false")
    if kind.lower() == "adam" and not params.get("adam_w_mode", True):
        raise Error("DeepSpeed config optimizer Adam with adam_w_mode=false (L2 regularisation) "
                    "is not supported; strata runs AdamW (decoupled weight decay)")
    out = {}
    for k in ("lr", "eps", "weight_decay"):
        if k in params:
            if params[k] == _AUTO:
                _unknown_auto(f"optimizer.params.{k}")
            out[k] = _number(f"optimizer.params.{k}", params[k])
    if "betas" in params:
        key, betas = "optimizer.params.betas", params["betas"]
        if betas == _AUTO:
            _unknown_auto(key)
        if (not isinstance(betas, (list, tuple)) or len(betas) != 2
                or any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in betas)
                or not all(0.0 <= b < 1.0 for b in betas)):
            _refuse(key, betas, "two numbers in [0, 1), as [0.9, 0.999]")
        out["betas"] = tuple(float(b) for b in betas)
    return out


def _scheduler(spec, optimizer):
    """(type, _WarmupLR's keyword arguments), or None."""
    if spec is None:
        return None
    _section("scheduler", spec, {"type", "params"})
    kind = spec.get("type")
    if kind not in ("WarmupLR", "WarmupDecayLR"):
        _refuse("scheduler.type", kind, "\"WarmupLR\" or \"WarmupDecayLR\" (for another, drive "
                "the optimizer's lr with a torch scheduler)")
    params = dict(_section("scheduler.params", spec.get("params", {}),
                           _SCHED_PARAMS if kind == "WarmupDecayLR"
                           else _SCHED_PARAMS - {"total_num_steps"}))
    if kind == "WarmupDecayLR" and "total_num_steps" not in params:
        raise Error("DeepSpeed config scheduler WarmupDecayLR needs params.total_num_steps")
    key = "scheduler.params."
    if params.get("warmup_min_lr") == _AUTO:
        params["warmup_min_lr"] = 0.0  # HF's value
    if params.get("warmup_max_lr") == _AUTO:
        if "lr" not in optimizer:
            raise Error("DeepSpeed config scheduler.params.warmup_max_lr=\"auto\": it is the "
                        "optimizer's learning rate, and optimizer.params.lr is not given")
        params["warmup_max_lr"] = optimizer["lr"]
    for k in ("warmup_min_lr", "warmup_max_lr"):
        if k in params:
            v = params[k]
            if isinstance(v, (list, tuple)):  # one per param group, as DeepSpeed allows
                params[k] = [_number(f"{key}{k}[{i}]", x) for i, x in enumerate(v)]
            else:
                params[k] = _number(key + k, v, "a finite number >= 0, or one per param group")
    for k, low in (("warmup_num_steps", 0), ("total_num_steps", 1), ("last_batch_iteration", -1)):
        if k in params:
            if params[k] == _AUTO:
                _unknown_auto(key + k)
            _integer(key + k, params[k], low)
    if "warmup_type" in params and params["warmup_type"] not in ("log", "linear"):
        _refuse(key + "warmup_type", params["warmup_type"], "\"log\" or \"linear\"")
    return kind, params
