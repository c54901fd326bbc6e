"""strata.optim.AdamW on plain CPU parameters against torch.optim.AdamW."""
import math

import pytest
import torch

import strata


def _params(seed, shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _set_grads(params, step):
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * (1 + step)


def _max_relative_error(a, b):
    """max |a - b| / |b| over the elements (0 where both are 0; inf where only b is 0)."""
    diff = (a - b).abs()
    rel = torch.where(diff == 0, torch.zeros_like(diff), diff / b.abs())
    return rel.max().item()


# torch >= 2 takes Tensor.sqrt() on the CPU from its own vector library (Sleef), which is not
# correctly rounded: on torch 2.15 about 1 element in 6 is an ulp off IEEE sqrt, the kernel's.
# So there the weights, which divide by sqrt(exp_avg_sq), can differ from torch's by an ulp
# of the update per step: within 1e-6 relative or one ulp of the tensor's largest magnitude.
# The moments involve no sqrt and match on every torch.
TORCH_SQRT_NOT_IEEE = int(torch.__version__.split(".")[0]) >= 2


def _assert_close(a, b, weights=False):
    """Every element within 1e-6 relative of torch's; no absolute floor (an element torch left
    at 0 must be 0) except for weights where torch's sqrt is not IEEE's (above)."""
    if weights and TORCH_SQRT_NOT_IEEE:
        floor = torch.finfo(torch.float32).eps * b.abs().max().item()
        worst = ((a - b).abs() - 1e-6 * b.abs()).max().item()
        assert worst <= floor, f"{worst:.3g} beyond 1e-6 relative, more than one ulp ({floor:.3g})"
        return
    err = _max_relative_error(a, b)
    assert err <= 1e-6, f"max relative error {err:.3g} > 1e-6"


SHAPES = [(37,), (64, 33), (5000,), (3, 7, 11), (1,)]


def _groups(params, lr):
    return [{"params": params[:2], "weight_decay": 0.1},
            {"params": params[2:4], "weight_decay": 0.0, "lr": lr * 3, "betas": (0.8, 0.99)},
            {"params": params[4:], "eps": 1e-6}]


@pytest.mark.parametrize("max_norm", [0.0, 1.0])
def test_matches_torch_adamw_with_groups_and_scheduler(max_norm):
    """rounding="torch" (the default) performs the installed torch's float operations in its
    order (torch 1.x: exp_avg.mul_().add_(); torch 2: exp_avg.lerp_()), so after 10 steps the
    moments equal torch's bit for bit and every weight is within 1e-6 relative of torch's,
    including the weights that crossed zero (where the fused form is not: see the next test);
    on torch 2 within one ulp of the largest weight too (TORCH_SQRT_NOT_IEEE)."""
    ours, ref = _params(0, SHAPES), _params(0, SHAPES)
    lr = 1e-2
    opt = strata.optim.AdamW(_groups(ours, lr), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.05, max_grad_norm=max_norm)
    topt = torch.optim.AdamW(_groups(ref, lr), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.05)
    assert isinstance(opt, torch.optim.Optimizer)
    lam = lambda s: 1.0 / (1 + s)  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, lam)
    for step in range(10):
        _set_grads(ours, step)
        _set_grads(ref, step)
        if max_norm:
            tnorm = torch.nn.utils.clip_grad_norm_(ref, max_norm)
        opt.step()
        topt.step()
        if max_norm:
            assert opt.last_grad_norm == pytest.approx(tnorm.item(), rel=1e-6)
        opt.zero_grad()
        topt.zero_grad()
        sched.step()
        tsched.step()
    assert opt.param_groups[1]["lr"] == topt.param_groups[1]["lr"]
    for a, b, start in zip(ours, ref, _params(0, SHAPES)):
        assert not torch.equal(a.detach(), start.detach())  # it trained
        _assert_close(a.detach(), b.detach(), weights=True)
        sa, sb = opt.state[a], topt.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert sa["step"] == 10


def _train_fused_and_torch(max_norm=0.0):
    ours, ref = _params(0, SHAPES), _params(0, SHAPES)
    lr = 1e-2
    kw = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)
    opt = strata.optim.AdamW(_groups(ours, lr), rounding="fused", max_grad_norm=max_norm, **kw)
    topt = torch.optim.AdamW(_groups(ref, lr), **kw)
    for step in range(10):
        _set_grads(ours, step)
        _set_grads(ref, step)
        if max_norm:
            torch.nn.utils.clip_grad_norm_(ref, max_norm)
        opt.step()
        topt.step()
    return ours, ref


def test_fused_rounding_differs_from_torch_only_by_cancellation():
    """Why rounding="torch" exists. The fused form rounds p*(1-lr*wd) - step*m/denom once where
    torch rounds the decay and the update separately (and, with clipping, takes the norm
    exactly where torch sums in fp32): a few ulps of the operands. Where the result cancels
    (a weight or exp_avg crossing zero) those ulps are a large share of the small result, so
    the element-wise relative error exceeds 1e-6, while every difference stays within 1e-6
    of the tensor's largest value."""
    worst = 0.0
    for max_norm in (0.0, 1.0):
        for a, b in zip(*_train_fused_and_torch(max_norm)):
            a, b = a.detach(), b.detach()
            worst = max(worst, _max_relative_error(a, b))
            assert (a - b).abs().max().item() <= 1e-6 * b.abs().max().item()
    assert worst > 1e-6  # the fused form is really used, and it is not torch's


def test_fused_rounding_is_closer_to_exact_adamw_than_torch_fp32():
    """The fused form's differences to torch are rounding: against AdamW in float64 its error
    is no larger than torch's own fp32 error."""
    ours, ref = _params(0, SHAPES), _params(0, SHAPES)
    exact = [torch.nn.Parameter(p.detach().double()) for p in _params(0, SHAPES)]
    lr = 1e-2
    kw = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)
    opts = [strata.optim.AdamW(_groups(ours, lr), rounding="fused", **kw),
            torch.optim.AdamW(_groups(ref, lr), **kw), torch.optim.AdamW(_groups(exact, lr), **kw)]
    for step in range(10):
        _set_grads(ours, step)
        _set_grads(ref, step)
        for p, q in zip(exact, ref):
            p.grad = q.grad.double()
        for o in opts:
            o.step()
    for a, b, c in zip(ours, ref, exact):
        ours_err = (a.detach().double() - c.detach()).abs().max().item()
        torch_err = (b.detach().double() - c.detach()).abs().max().item()
        assert ours_err <= torch_err * 1.01 + 1e-12


def test_clipping_applies_over_all_groups():
    ours = _params(1, [(100,), (100,)])
    opt = strata.optim.AdamW([{"params": [ours[0]]}, {"params": [ours[1]]}], lr=0.1,
                             max_grad_norm=0.5, weight_decay=0.0)
    ours[0].grad = torch.full((100,), 3.0)
    ours[1].grad = torch.full((100,), 4.0)
    opt.step()
    assert opt.last_grad_norm == pytest.approx(50.0)  # sqrt(100*9 + 100*16)


def test_non_finite_gradient_skips_the_step():
    (p,) = _params(2, [(10,)])
    before = p.detach().clone()
    opt = strata.optim.AdamW([p], lr=0.1, max_grad_norm=1.0)
    p.grad = torch.ones(10)
    p.grad[3] = float("inf")
    opt.step()
    assert opt.last_step_skipped and math.isnan(opt.last_grad_norm)
    assert torch.equal(p.detach(), before)


def test_parameters_without_gradient_are_left_alone():
    a, b = _params(3, [(10,), (10,)])
    before = b.detach().clone()
    opt = strata.optim.AdamW([a, b], lr=0.1)
    a.grad = torch.ones(10)
    opt.step()
    assert torch.equal(b.detach(), before) and b not in opt.state


def test_bad_parameters_and_settings_raise_strata_error():
    with pytest.raises(strata.Error, match="float32"):
        strata.optim.AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    with pytest.raises(strata.Error, match="contiguous"):
        strata.optim.AdamW([torch.nn.Parameter(torch.zeros(4, 4).t())])
    with pytest.raises(strata.Error, match="rounding"):
        strata.optim.AdamW(_params(0, [(3,)]), rounding="exact")
    with pytest.raises(strata.Error, match="betas"):
        strata.optim.AdamW(_params(0, [(3,)]), betas=(1.0, 0.9))
    with pytest.raises(RuntimeError):  # strata.Error is a RuntimeError
        strata.optim.AdamW(_params(0, [(3,)]), lr=-1)
    (p,) = _params(0, [(3,)])
    opt = strata.optim.AdamW([p])
    p.grad = torch.zeros(6)[::2]
    with pytest.raises(strata.Error, match="gradient"):
        opt.step()


def test_version_and_error():
    assert strata.__version__.count(".") == 2
    assert issubclass(strata.Error, RuntimeError)
