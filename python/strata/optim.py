"""strata.optim.AdamW: a torch.optim.Optimizer on Strata's SIMD AdamW kernel.

Two uses, chosen by the parameters it is given:

* plain CPU parameters (fp32, contiguous): a CPU optimizer like DeepSpeedCPUAdam. Each group
  has its own lr, betas, eps and weight_decay; max_grad_norm clips the gradient norm over all
  groups together (torch.nn.utils.clip_grad_norm_'s coefficient, fused into the update).
  rounding="torch" (the default) rounds every operation as the installed torch's
  torch.optim.AdamW does on the CPU (torch 1.x: exp_avg.mul_(beta1).add_(grad, ...); torch 2:
  exp_avg.lerp_(grad, 1 - beta1)), and computes the clipping norm as clip_grad_norm_ does
  (fp32), so the results equal torch.optim.AdamW's after clip_grad_norm_ (within 1e-6
  relative, element by element, in tests/python/test_optim.py, on torch 1.13 and 2.15).
  rounding="fused" is the engine's form: the weight rounded once per step (closer to exact
  AdamW) and the norm exact in double; what an offloaded model computes. Both run the same
  SIMD kernel (cpu_optim, AdamMode::kAdamWTorch or kAdamW).
  state_dtype="int8" keeps the moments as block-quantized uint8 codes (strata/optim.h);
  master_dtype="bf16" keeps a 2-byte master in the state ("master", bf16) and sets each
  parameter to it after the step, updated with master_rounding="kahan" (a bf16 compensation
  "master_comp": 4 bytes, two 16-bit streams) or "stochastic" (2 bytes). Both need
  rounding="fused" and combine with either state_dtype (docs/design.md, "2-byte master").
  state_dict() gives int8 moments dequantized (torch's layout) and every other entry (the bf16
  "master", "master_comp") as it is; load_state_dict() takes either layout back and keeps each
  entry's dtype (torch's own would cast them to the parameter's fp32), so a run continues bit
  for bit.
* the parameters of a model given to strata.offload: the engine holds them and their states
  and runs the update itself, overlapped with backward; step() waits for it and commits it.

Either way it is a torch.optim.Optimizer, so torch's schedulers (LambdaLR, ...) drive its lr.
For an offloaded model the moments live in the engine: state_dict() reads them from it (the last
committed step) and load_state_dict() writes them back, into this engine or a new one; a whole
run is continued with strata.load_checkpoint, or from its NVMe folders with
strata.Engine(..., resume=True). Each param group's lr, betas, eps and weight_decay apply to its
own parameters, read at every step.
"""
import math

import torch

from . import _strata
from ._checkpoint import read_moments, write_moments
from ._strata import Error

__all__ = ["AdamW"]

# The kernel's rounding that reproduces this torch's AdamW (see the module docstring).
_TORCH_ROUNDING = "torch2" if int(torch.__version__.split(".")[0]) >= 2 else "torch1"


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 max_grad_norm=0.0, threads=0, rounding="torch", state_dtype="fp32",
                 master_dtype="fp32", master_rounding="stochastic"):
        if not lr >= 0.0:
            raise Error(f"AdamW lr={lr}: must be >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise Error(f"AdamW betas={betas}: each must be in [0, 1)")
        if not 0.0 <= eps < math.inf:  # as `strata train --eps`: 0 is accepted
            raise Error(f"AdamW eps={eps}: must be a finite number >= 0")
        if not weight_decay >= 0.0:
            raise Error(f"AdamW weight_decay={weight_decay}: must be >= 0")
        if rounding not in ("torch", "fused"):
            raise Error(f"AdamW rounding={rounding!r}: expected \"torch\" or \"fused\"")
        if state_dtype not in ("fp32", "int8"):
            raise Error(f"AdamW state_dtype={state_dtype!r}: expected \"fp32\" or \"int8\"")
        if state_dtype == "int8" and rounding != "fused":
            raise Error("AdamW state_dtype=\"int8\" runs the fused kernel: pass rounding=\"fused\"")
        if master_dtype not in ("fp32", "bf16"):
            raise Error(f"AdamW master_dtype={master_dtype!r}: expected \"fp32\" or \"bf16\"")
        if master_rounding not in ("stochastic", "kahan"):
            raise Error(f"AdamW master_rounding={master_rounding!r}: expected \"stochastic\" "
                        "or \"kahan\"")
        if master_dtype == "bf16" and rounding != "fused":
            raise Error("AdamW master_dtype=\"bf16\" runs the fused kernel: pass "
                        "rounding=\"fused\"")
        if not max_grad_norm >= 0.0:
            raise Error(f"AdamW max_grad_norm={max_grad_norm}: must be >= 0 (0 = no clipping)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.max_grad_norm = float(max_grad_norm)
        self.threads = int(threads)
        self.rounding = rounding
        self.state_dtype = state_dtype
        self.master_dtype = master_dtype
        self.master_rounding = master_rounding
        self.last_grad_norm = None  # the norm before clipping, when max_grad_norm > 0
        self.last_step_skipped = False  # a non-finite gradient: nothing was updated
        offloaded = [getattr(p, "_strata_offload", None) for g in self.param_groups
                     for p in g["params"]]
        owners = {id(o) for o in offloaded}
        self._offload = None
        if any(o is not None for o in offloaded):
            if any(o is None for o in offloaded) or len(owners) > 1:
                raise Error("AdamW was given parameters of an offloaded model together with "
                            "other parameters; give it the offloaded model's parameters only "
                            "(one optimizer per strata.offload model)")
            self._offload = offloaded[0]
            self._offload.bind_optimizer(self)
        else:
            for g in self.param_groups:
                for p in g["params"]:
                    _check_plain(p)

    def state_dict(self):
        """torch.optim.Optimizer's state_dict; for an offloaded model its "state" holds each
        parameter's moments and step read from the engine (the last committed step)."""
        sd = super().state_dict()
        if self._offload is not None:
            sd["state"] = read_moments(self._offload, self)
        elif self.state_dtype == "int8":  # dequantized, as torch.optim.AdamW's state
            params = [p for g in self.param_groups for p in g["params"]]
            sd["state"] = {i: _int8_to_float(s, params[i]) for i, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict):
        """For an offloaded model: the param_groups' settings (lr, betas, eps, weight_decay)
        are loaded, and the moments and step, when "state" holds them, are written into the
        engine between steps (Engine.write_component): the next step continues the run that
        saved them (its AdamW bias correction counts that run's steps). The weights are the
        model's: load them with the model (or continue a whole run with
        strata.load_checkpoint)."""
        if self._offload is None:
            return self._load_plain(state_dict)
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, groups)):
            raise Error("load_state_dict: the state_dict's param groups differ in number or size "
                        f"from this optimizer's ({[len(g['params']) for g in groups]} params "
                        f"given, {[len(g['params']) for g in self.param_groups]} here)")
        # The saved params' ids, in param-group order, as this optimizer's indices (torch's
        # state_dict numbers them 0, 1, ...; another saver may not).
        index = {old: new for new, old in enumerate(i for g in groups for i in g["params"])}
        moments = {index[i]: s for i, s in state_dict.get("state", {}).items()}
        if moments:
            write_moments(self._offload, self, moments)
        super().load_state_dict({"state": {}, "param_groups": groups})

    def _load_plain(self, state_dict):
        """load_state_dict of plain parameters. torch's Optimizer.load_state_dict casts every
        state tensor of an fp32 parameter to fp32: the bf16 "master" and "master_comp" and the
        uint8 codes of int8 moments too. Their dtypes are read from `state_dict` before it runs
        and given back after (exact: fp32 holds every bf16 and uint8 value). Codes given to an
        fp32-moment optimizer are dequantized first; fp32 moments given to an int8 one are
        quantized after."""
        saved = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        states = dict(state_dict.get("state", {}))
        kept = {}  # saved index -> {key: dtype torch would change}
        for i, s in states.items():
            if _holds_codes(s) and self.state_dtype == "fp32":
                if len(saved) != len(params) or i not in saved:
                    raise Error("load_state_dict: the state_dict's int8 moments do not match "
                                "this optimizer's parameters")
                s = states[i] = _int8_to_float(s, params[saved.index(i)])
            kept[i] = {k: v.dtype for k, v in s.items()
                       if torch.is_tensor(v) and v.dtype in (torch.bfloat16, torch.uint8)}
        super().load_state_dict(dict(state_dict, state=states))
        for i, p in zip(saved, params):
            s = self.state.get(p)
            if not s:
                continue
            for k, dtype in kept.get(i, {}).items():
                s[k] = s[k].to(dtype)
            if self.state_dtype == "int8" and "exp_avg" in s and not _holds_codes(s):
                _int8_from_float(s, p)  # fp32 moments (torch's layout) quantized
            if self.master_dtype == "bf16" and "master" not in s:  # saved with an fp32 master
                s["master"] = p.detach().reshape(-1).to(torch.bfloat16)
            if self.master_rounding == "kahan" and self.master_dtype == "bf16":
                s.setdefault("master_comp", torch.zeros(p.numel(), dtype=torch.bfloat16))
        return None

    def zero_grad(self, set_to_none=False):
        if self._offload is not None:
            return  # the engine holds the gradients and clears them after each update
        super().zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    @property
    def _step_supports_amp_scaling(self):
        """For an offloaded model, GradScaler.step hands itself to step() (grad_scaler=, or the
        grad_scale attribute in torch 2), which refuses it: see _refuse_grad_scaler."""
        return self._offload is not None

    def _refuse_grad_scaler(self):
        """A GradScaler's scaled gradients went into the engine, which cannot unscale or check
        them (they never reach .grad): the step is dropped where it can be (NVMe folders keep the
        last commit), else committed as it ran, and the scaler is refused either way."""
        try:
            self._offload.abort_step()
            done = "the step was dropped"
        except Error:
            self._offload.end_step(self)
            done = ("the step's updates had already run on the scaled gradients and it was "
                    "committed (with NVMe folders it is dropped instead)")
        raise Error("GradScaler.step() with an offloaded model: its gradients never reach .grad, "
                    f"so the scaler can neither unscale nor check them; {done}. fp16 is not "
                    "supported: train in bf16 (torch.autocast(..., dtype=torch.bfloat16) or "
                    "model.bfloat16()) without a GradScaler")

    def step(self, closure=None, grad_scaler=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._offload is not None:
            if grad_scaler is not None or getattr(self, "grad_scale", None) is not None:
                self._refuse_grad_scaler()
            self._offload.end_step(self)
            return loss
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        scale = 1.0
        self.last_step_skipped = False
        if self.max_grad_norm > 0 and params:
            for p in params:
                _check_plain(p)
            if self.rounding == "torch":
                norm, scale = _torch_clip(params, self.max_grad_norm)
            else:
                norm, scale = self._fused_clip(params)
            self.last_grad_norm = norm
            if not math.isfinite(norm):
                self.last_step_skipped = True
                return loss
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                _check_plain(p)
                state = self.state[p]
                if self.master_dtype == "bf16":
                    self._step_bf16_master(p, state, group, scale)
                    continue
                if self.state_dtype == "int8":
                    self._step_int8(p, state, group, scale)
                    continue
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.contiguous_format)
                state["step"] += 1
                _check_state(state, p, ("exp_avg", "exp_avg_sq"), codes=False)
                _strata.adam_step_f32(p.data_ptr(), state["exp_avg"].data_ptr(),
                                      state["exp_avg_sq"].data_ptr(), p.grad.data_ptr(),
                                      p.numel(), float(group["lr"]), float(beta1), float(beta2),
                                      float(group["eps"]), float(group["weight_decay"]),
                                      int(state["step"]), scale, True, self.threads,
                                      _TORCH_ROUNDING if self.rounding == "torch" else "fused")
        return loss


    def _step_int8(self, p, state, group, scale):
        """One step of p with int8 moments: uint8 codes "exp_avg", "exp_avg_sq" and their
        per-2048 fp32 scales "exp_avg_scale", "exp_avg_sq_scale" (strata/optim.h)."""
        if not state:
            blocks = _strata.int8_state_blocks(p.numel())
            state["step"] = 0
            state["exp_avg"] = torch.zeros(p.numel(), dtype=torch.uint8)
            state["exp_avg_sq"] = torch.zeros(p.numel(), dtype=torch.uint8)
            state["exp_avg_scale"] = torch.zeros(blocks, dtype=torch.float32)
            state["exp_avg_sq_scale"] = torch.zeros(blocks, dtype=torch.float32)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        key = self._rounding_key(p, state)
        _check_state(state, p, ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"))
        _strata.adam_step_int8(p.data_ptr(), state["exp_avg"].data_ptr(),
                               state["exp_avg_sq"].data_ptr(), state["exp_avg_scale"].data_ptr(),
                               state["exp_avg_sq_scale"].data_ptr(), p.grad.data_ptr(),
                               p.numel(), float(group["lr"]), float(beta1), float(beta2),
                               float(group["eps"]), float(group["weight_decay"]),
                               int(state["step"]), scale, key, False, self.threads)

    def _rounding_key(self, p, state):
        """The stochastic rounding's key: the step and the parameter's place (the same in
        every run)."""
        if not hasattr(self, "_int8_index"):
            self._int8_index = {id(q): i for i, q in
                                enumerate(q for g in self.param_groups for q in g["params"])}
        return (int(state["step"]) * 0x9E3779B97F4A7C15 + self._int8_index[id(p)] *
                0xC2B2AE3D27D4EB4F) & 0xFFFFFFFFFFFFFFFF

    def _step_bf16_master(self, p, state, group, scale):
        """One step of p with a 2-byte master (strata/optim.h MasterFormat): the bf16 weight
        "master" (+ the bf16 Kahan term "master_comp"), fp32 or int8 moments; p (fp32, what the
        model computes with) is set to the bf16 master after each step."""
        n = p.numel()
        if not state:
            state["step"] = 0
            state["master"] = p.detach().reshape(-1).to(torch.bfloat16)
            if self.master_rounding == "kahan":
                state["master_comp"] = torch.zeros(n, dtype=torch.bfloat16)
            if self.state_dtype == "int8":
                blocks = _strata.int8_state_blocks(n)
                state["exp_avg"] = torch.zeros(n, dtype=torch.uint8)
                state["exp_avg_sq"] = torch.zeros(n, dtype=torch.uint8)
                state["exp_avg_scale"] = torch.zeros(blocks, dtype=torch.float32)
                state["exp_avg_sq_scale"] = torch.zeros(blocks, dtype=torch.float32)
            else:
                state["exp_avg"] = torch.zeros(n, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros(n, dtype=torch.float32)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        int8 = self.state_dtype == "int8"
        comp = state.get("master_comp")
        _check_state(state, p, ("master", "exp_avg", "exp_avg_sq")
                     + (("master_comp",) if comp is not None else ())
                     + (("exp_avg_scale", "exp_avg_sq_scale") if int8 else ()), codes=int8)
        _strata.adam_step_bf16_master(
            state["master"].data_ptr(), comp.data_ptr() if comp is not None else 0, 0,
            state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(),
            state["exp_avg_scale"].data_ptr() if int8 else 0,
            state["exp_avg_sq_scale"].data_ptr() if int8 else 0, p.grad.data_ptr(), n,
            float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
            float(group["weight_decay"]), int(state["step"]), scale, self._rounding_key(p, state),
            "bf16-kahan" if self.master_rounding == "kahan" else "bf16-sr", self.threads)
        p.data.copy_(state["master"].view(p.shape))

    def _fused_clip(self, params):
        """The engine's clipping: the norm exact in double (Strata's deterministic kernel),
        scaled only when above max_grad_norm. (norm, scale); norm NaN when non-finite."""
        total, non_finite = 0.0, 0
        for p in params:
            s, n = _strata.grad_norm_squared_f32(p.grad.data_ptr(), p.grad.numel(), self.threads)
            total += s
            non_finite += n
        if non_finite:
            return float("nan"), 1.0
        norm = math.sqrt(total)
        if norm > self.max_grad_norm:
            return norm, self.max_grad_norm / (norm + 1e-6)
        return norm, 1.0


def _int8_to_float(state, p):
    """Plain int8 state (codes and per-2048 scales) as torch.optim.AdamW's: fp32 exp_avg and
    exp_avg_sq of p's shape, dequantized (exp_avg_sq squared from its stored root)."""
    if "exp_avg_scale" not in state:
        return state
    _check_state(state, p, ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"))
    m = torch.empty(p.shape, dtype=torch.float32)
    v = torch.empty(p.shape, dtype=torch.float32)
    _strata.int8_moments_to_float(state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(),
                                  state["exp_avg_scale"].data_ptr(),
                                  state["exp_avg_sq_scale"].data_ptr(), p.numel(),
                                  m.data_ptr(), v.data_ptr())
    rest = {k: v for k, v in state.items()
            if k not in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale")}
    return {**rest, "exp_avg": m, "exp_avg_sq": v}  # "step", a bf16 "master", ... as they are


_STATE_DTYPES = {"master": torch.bfloat16, "master_comp": torch.bfloat16,
                 "exp_avg_scale": torch.float32, "exp_avg_sq_scale": torch.float32}


def _check_state(state, p, keys, codes=True):
    """strata.Error unless state[k] for each of `keys` is what the kernel reads at its address:
    a contiguous CPU tensor of the dtype and size it expects for p (int8 moments as uint8 codes
    when `codes`, else fp32)."""
    n = p.numel()
    for k in keys:
        v = state[k]
        dtype = _STATE_DTYPES.get(k, torch.uint8 if codes else torch.float32)
        size = _strata.int8_state_blocks(n) if k.endswith("_scale") else n
        if (not torch.is_tensor(v) or v.dtype != dtype or v.numel() != size
                or v.device.type != "cpu" or not v.is_contiguous()):
            got = (f"{v.dtype}, {v.numel()} values on {v.device}" if torch.is_tensor(v)
                   else type(v).__name__)
            raise Error(f"strata.optim.AdamW: the state's {k!r} of a parameter of shape "
                        f"{tuple(p.shape)} is {got}; the kernel needs {dtype}, {size} values "
                        "(a state loaded from another optimizer?)")


def _holds_codes(state):
    """Whether `state` holds int8 moments (uint8 codes and their scales), not fp32 ones."""
    return "exp_avg_scale" in state and state["exp_avg"].dtype == torch.uint8


def _int8_from_float(state, p):
    """The mirror of _int8_to_float, in place: fp32 moments quantized to nearest."""
    m = state["exp_avg"].detach().float().cpu().contiguous()
    v = state["exp_avg_sq"].detach().float().cpu().contiguous()
    n = p.numel()
    if m.numel() != n or v.numel() != n:
        raise Error(f"load_state_dict: moments of {m.numel()} and {v.numel()} values for a "
                    f"parameter of {n}")
    blocks = _strata.int8_state_blocks(n)
    for k in ("exp_avg", "exp_avg_sq"):
        state[k] = torch.zeros(n, dtype=torch.uint8)
        state[k + "_scale"] = torch.zeros(blocks, dtype=torch.float32)
    _strata.int8_moments_from_float(m.data_ptr(), v.data_ptr(), n, state["exp_avg"].data_ptr(),
                                    state["exp_avg_sq"].data_ptr(),
                                    state["exp_avg_scale"].data_ptr(),
                                    state["exp_avg_sq_scale"].data_ptr())
    state["step"] = int(state["step"])


def _torch_clip(params, max_norm):
    """torch.nn.utils.clip_grad_norm_'s norm and coefficient, rounded as it rounds them (fp32
    per-tensor norms in param-group order, their norm, max_norm / (norm + 1e-6) clamped at 1):
    the kernel's g * scale then equals clip_grad_norm_'s g.mul_(coef). (norm, scale); norm NaN
    when non-finite."""
    total = torch.norm(torch.stack([torch.norm(p.grad.detach(), 2.0) for p in params]), 2.0)
    if not math.isfinite(total.item()):
        return float("nan"), 1.0
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return total.item(), coef.item()


def _check_plain(p):
    """A parameter the CPU kernel can update in place: fp32, CPU, contiguous, dense grad."""
    if p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous():
        raise Error(f"strata.optim.AdamW updates contiguous float32 CPU parameters; got one "
                    f"of shape {tuple(p.shape)}, {p.dtype} on {p.device} (move it with "
                    ".float().cpu(), or offload the model with strata.offload)")
    g = p.grad
    if g is not None and (g.is_sparse or g.dtype != torch.float32 or not g.is_contiguous()
                          or g.device.type != "cpu"):
        raise Error(f"strata.optim.AdamW needs dense contiguous float32 CPU gradients; the "
                    f"gradient of a parameter of shape {tuple(p.shape)} is {g.dtype}, "
                    f"{'sparse' if g.is_sparse else 'dense'} on {g.device}")
