"""What an offloaded model's Parameters show torch between their uses.

The engine holds the values (fp32 masters, moments) and the gradients; a Parameter of the
model points at the engine's buffer only while its block runs. In between it keeps a
*placeholder*: a zero-stride view of one NaN element, expanded to the parameter's true shape.
So `p.shape`, `p.numel()`, `model.num_parameters()` and `sum(p.numel() for p in
model.parameters())` tell the truth at the cost of 4 bytes a parameter, and a computation that
reads a placeholder gives NaN rather than a plausible number. (A tensor subclass that faked
values, or meta tensors, were the alternatives: meta tensors cannot move to a device, which
`model.to(device)` in Trainer and accelerate does; a subclass would route every op of the
blocks' forward through Python.)

Each offloaded Parameter's class becomes `OffloadedParameter` (a torch.nn.Parameter, so
`isinstance` and optimizers see a Parameter) for one reason: its `.grad`. The gradient of an
offloaded parameter lives in the engine, never in `.grad`; code that reads `.grad` to clip or
inspect it (torch.nn.utils.clip_grad_norm_, accelerate's clipping) would see None and silently
do nothing. So while a step is open a read of `.grad` raises strata.Error naming the two ways
that work: strata.optim.AdamW(max_grad_norm=...), which clips with the engine's global norm,
and strata.clip_grad_norm_, which returns that norm. Between steps `.grad` is None, as after
torch's zero_grad(). The class is assigned, not constructed: the model keeps its Parameter
objects (optimizers, hooks and tied weights refer to them).
"""
import torch

from ._strata import Error

_TENSOR_GRAD = torch.Tensor.grad  # torch's own descriptor (autograd's C++ never calls ours)

CLIP_HOW = ("clip with strata.optim.AdamW(..., max_grad_norm=X) (the engine clips with the "
            "step's global norm; opt.last_grad_norm holds it after opt.step()), or call "
            "strata.clip_grad_norm_(model.parameters(), X), which returns that norm")


class OffloadedParameter(torch.nn.Parameter):
    """A Parameter whose values and gradient the strata engine holds (see the module doc)."""

    @property
    def grad(self):
        state = getattr(self, "_strata_offload", None)
        if state is not None and state.gradients_in_engine():
            raise Error(f"the gradient of offloaded parameter {state.param_name(self)!r} is "
                        "held by the strata engine, not in .grad (it is accumulated and clipped "
                        f"there); {CLIP_HOW}")
        return _TENSOR_GRAD.__get__(self)

    @grad.setter
    def grad(self, value):
        _TENSOR_GRAD.__set__(self, value)

    @grad.deleter
    def grad(self):
        _TENSOR_GRAD.__set__(self, None)


def tensor_grad(p):
    """p's .grad as autograd left it (no check): the rest block's accumulated gradient."""
    return _TENSOR_GRAD.__get__(p)


def set_tensor_grad(p, value):
    _TENSOR_GRAD.__set__(p, value)


def mark_offloaded(p):
    """Gives `p` the OffloadedParameter class (see the module doc)."""
    if type(p) is torch.nn.Parameter:
        p.__class__ = OffloadedParameter
    elif not isinstance(p, OffloadedParameter):
        raise Error(f"parameter of type {type(p).__name__} cannot be offloaded: strata.offload "
                    "takes torch.nn.Parameter (not a subclass)")


def placeholder(shape, dtype, device):
    """A tensor of `shape` that owns one NaN element (a zero-stride expanded view)."""
    one = torch.full((1,), float("nan"), dtype=dtype, device=device)
    shape = tuple(shape)
    return one.view([1] * len(shape)).expand(shape) if shape else one.view(())
