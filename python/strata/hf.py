"""strata.hf.Trainer: transformers' Trainer with the model offloaded into a strata.Engine.

From a plain Trainer script the change is the class and where the states go:

    trainer = strata.hf.Trainer(model=model, args=args, train_dataset=ds,
                                engine=strata.Engine(nvme=["/nvme/run"], host_mem="16G"))

or, from a DeepSpeed ZeRO-3 offload script, the same config dict given here instead of
`TrainingArguments(deepspeed=...)`: `strata.hf.Trainer(..., deepspeed_config=ds_config)`.

What it does with the model and TrainingArguments:
- the model is offloaded (strata.offload) with its repeated blocks (`blocks=`, default the
  largest nn.ModuleList of one module type: Llama's model.layers, GPT-2's transformer.h; a
  peft model's too) and `gradient_accumulation_steps` as the engine's micro-batches;
- the optimizer is strata.optim.AdamW with the arguments' learning_rate, adam_beta1/2,
  adam_epsilon and weight_decay (transformers' decay/no-decay groups) and max_grad_norm: the
  engine clips with the step's global norm, and the logged grad_norm is that norm
  (strata.clip_grad_norm_); the lr schedulers and warm-up are transformers' own, on it;
- bf16 autocast, logging and the evaluation loop (no_grad forwards read the committed
  weights) are transformers' own;
- save_model() writes what from_pretrained loads (the model's streaming save_pretrained:
  strata/_state_dict.py); a checkpoint (save_steps) of an engine with NVMe folders holds the
  engine's whole state (strata.save_checkpoint into `checkpoint-N/strata`), and
  resume_from_checkpoint continues from it bit for bit in a fresh process (without NVMe
  folders the optimizer's state_dict and the saved weights are restored instead).
TrainingArguments it cannot honour are refused by name before anything is offloaded (fp16,
gradient_checkpointing: the layer recomputes the blocks itself, another `optim`, deepspeed,
fsdp, torch_compile, ...), as is a client optimizer or a model offloaded elsewhere.
"""
import os

import torch

from . import optim
from ._checkpoint import load_checkpoint, save_checkpoint
from ._clip import clip_grad_norm_
from ._deepspeed import _find_blocks
from ._ds_config import resolve_for_trainer
from ._offload import Engine, offload
from ._strata import Error

try:
    import transformers
except ImportError as e:  # pragma: no cover - import-time message
    raise ImportError("strata.hf needs transformers (pip install transformers accelerate)") from e

__all__ = ["Trainer"]

_STRATA_DIR = "strata"  # the engine's checkpoint inside checkpoint-N
_OPTIMS = {"adamw_torch", "adamw_torch_fused", "adamw_hf"}


def _refuse_arguments(args):
    """TrainingArguments the offloaded model cannot honour, refused by name."""
    refused = []
    if getattr(args, "fp16", False):
        refused.append("fp16=True (strata trains fp32 master weights without loss scaling: use "
                       "bf16=True)")
    for name in ("gradient_checkpointing", "activation_checkpointing"):
        if getattr(args, name, False) is True:
            refused.append(f"{name}=True (strata.offload recomputes the blocks itself: "
                           "leave it off)")
    optim_name = str(getattr(args, "optim", "adamw_torch")).split(".")[-1].lower()
    if optim_name not in _OPTIMS:
        refused.append(f"optim={optim_name!r} (the engine runs AdamW: use the default)")
    for name in ("deepspeed", "fsdp", "torch_compile"):
        if getattr(args, name, None):
            refused.append(f"{name}={getattr(args, name)!r} (give a DeepSpeed config as "
                           "strata.hf.Trainer(deepspeed_config=...))" if name == "deepspeed"
                           else f"{name}={getattr(args, name)!r}")
    if getattr(args, "optim_target_modules", None):
        refused.append("optim_target_modules")
    if refused:
        raise Error("strata.hf.Trainer cannot honour these TrainingArguments: "
                    + "; ".join(refused))


def _engine_from_deepspeed(config, args):
    """A strata.Engine for a DeepSpeed ZeRO-3 offload config dict, checked whole by
    _ds_config.resolve_for_trainer ("auto" takes the TrainingArguments' value; a number that
    disagrees with them is refused by name)."""
    resolved = resolve_for_trainer(config, args)
    return Engine(nvme=resolved.nvme or None)


class Trainer(transformers.Trainer):
    """transformers.Trainer over a strata.Engine (see the module doc).

    `engine`: a strata.Engine (default: strata.Engine(), or one built from `deepspeed_config`).
    `blocks`: the model's repeated sub-modules in forward order (default: found as
    strata.initialize finds them). `offload_options`: strata.offload's other keywords
    (recompute, offload_activations, activation_bytes, weights, ...)."""

    def __init__(self, model=None, args=None, *trainer_args, engine=None, deepspeed_config=None,
                 blocks=None, offload_options=None, **trainer_kwargs):
        if model is None:
            raise Error("strata.hf.Trainer needs the model itself (model_init is not supported: "
                        "the engine is built around one model)")
        if args is None:
            args = transformers.TrainingArguments(output_dir="trainer_output")
        _refuse_arguments(args)
        optimizers = trainer_kwargs.get("optimizers", (None, None))
        if optimizers[0] is not None:
            raise Error("strata.hf.Trainer builds its own strata.optim.AdamW from the "
                        "TrainingArguments; leave `optimizers` out (a scheduler alone may be "
                        "given through create_scheduler)")
        if engine is not None and deepspeed_config is not None:
            raise Error("give strata.hf.Trainer an engine or a deepspeed_config, not both")
        if deepspeed_config is not None:
            engine = _engine_from_deepspeed(deepspeed_config, args)
        if any(getattr(p, "_strata_offload", None) is not None for p in model.parameters()):
            raise Error("the model is already offloaded; give strata.hf.Trainer the model "
                        "itself and the engine (engine=...)")
        self.strata_engine = engine if engine is not None else Engine()
        offload(model, blocks=list(blocks) if blocks is not None else _find_blocks(model),
                engine=self.strata_engine, micro_batches=args.gradient_accumulation_steps,
                **(offload_options or {}))
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        # transformers 4.x clips through the accelerator inline; 5.x through _clip_grad_norm.
        self.accelerator.clip_grad_norm_ = self._strata_clip

    # --- optimizer and clipping ---------------------------------------------------------

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            model = self.model if model is None else model
            decay = set(self.get_decay_parameter_names(model))
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            groups = [{"params": [p for n, p in named if n in decay],
                       "weight_decay": self.args.weight_decay},
                      {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
            groups = [g for g in groups if g["params"]]
            self.optimizer = optim.AdamW(
                groups, lr=self.args.learning_rate,
                betas=(self.args.adam_beta1, self.args.adam_beta2), eps=self.args.adam_epsilon,
                max_grad_norm=max(float(self.args.max_grad_norm or 0.0), 0.0))
        return self.optimizer

    def _strata_clip(self, parameters, max_norm, norm_type=2):
        return clip_grad_norm_(parameters, max_norm, norm_type)

    def _clip_grad_norm(self, model):
        return clip_grad_norm_(model.parameters(), self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        # Without clipping the updates run before the norm is known: none is logged.
        return grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm

    # --- checkpoints --------------------------------------------------------------------

    def _engine_checkpoint(self, folder):
        path = os.path.join(folder, _STRATA_DIR)
        return path if self.strata_engine.config.nvme else None

    def _save_optimizer_and_scheduler(self, output_dir):
        path = self._engine_checkpoint(output_dir)
        if path is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        save_checkpoint(self.model, path, optimizer=self.optimizer,
                        lr_scheduler=self.lr_scheduler)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        path = self._engine_checkpoint(resume_from_checkpoint)
        if path is not None and os.path.isdir(path):
            return  # the weights come with the engine's state (_load_optimizer_and_scheduler)
        return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint):
        path = self._engine_checkpoint(checkpoint) if checkpoint is not None else None
        if path is None or not os.path.isdir(path):
            return super()._load_optimizer_and_scheduler(checkpoint)
        load_checkpoint(self.model, path, optimizer=self.optimizer,
                        lr_scheduler=self.lr_scheduler)
