"""strata.clip_grad_norm_: torch.nn.utils.clip_grad_norm_ for a model that may be offloaded.

An offloaded model's gradients live in the engine, which clips them itself: with
strata.optim.AdamW(max_grad_norm=X) every update is scaled by the step's global norm
(speculated or waited for, docs/design.md "Clipping"). What a clip_grad_norm_ call can still do
is what the caller reads from it: the norm. So for an offloaded model this returns the engine's
global L2 norm before clipping, once every gradient of the step is in (Engine::GradNorm: the
same double that opt.last_grad_norm holds after opt.step(), here as a float64 tensor), and the
clipping happens, exactly, in opt.step(). A call it cannot honour raises strata.Error instead of
clipping nothing: another max_norm than the optimizer's max_grad_norm (0 included), another
norm_type, only part of the model's trainable parameters, or parameters of two models. For
parameters that are not offloaded it is torch's own function.
"""
import math

import torch

from ._strata import Error


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """See the module doc. Returns the total norm (a 0-dim tensor)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    states = {}
    for p in params:
        s = getattr(p, "_strata_offload", None)
        if s is not None:
            states[id(s)] = s
    if not states:
        kwargs = {"error_if_nonfinite": error_if_nonfinite}
        if foreach is not None:
            kwargs["foreach"] = foreach
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, **kwargs)
    if len(states) > 1:
        raise Error("clip_grad_norm_ was given the parameters of two offloaded models; clip "
                    "each model's parameters on their own (each engine has its own norm)")
    state = next(iter(states.values()))
    if float(norm_type) != 2.0:
        raise Error(f"clip_grad_norm_(norm_type={norm_type}) on an offloaded model: its engine "
                    "clips by the L2 norm (norm_type=2) only")
    given = {id(p) for p in params}
    outside = [p for p in params if getattr(p, "_strata_offload", None) is None
               and p.grad is not None]
    if outside:
        raise Error("clip_grad_norm_ was given parameters of an offloaded model together with "
                    f"{len(outside)} other parameter(s) that have gradients; the engine's norm "
                    "covers the offloaded model's parameters only: clip the others apart")
    missing = [n for n, p in state.trainable_params() if id(p) not in given]
    if missing:
        raise Error("clip_grad_norm_ on part of an offloaded model's parameters (missing: "
                    f"{missing[:3]}): its engine clips by the norm over all of them; pass "
                    "model.parameters()")
    norm = state.grad_norm(max_norm)
    if error_if_nonfinite and not math.isfinite(norm):
        raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. (The engine "
                           "skips such a step whole.)")
    return torch.tensor(norm, dtype=torch.float64)
