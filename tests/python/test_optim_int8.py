"""strata.optim.AdamW(state_dtype="int8") on plain CPU parameters: uint8 codes with per-2048
scales in the state, a step that reruns to the same bits, and training no worse than fp32
states."""
import pytest
import torch

import strata
import strata.optim


def _fit(state_dtype, steps=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(5000, generator=g)
    weight = torch.logspace(0, -4, 5000)  # curvatures over four decades
    p = torch.nn.Parameter(torch.zeros(5000))
    opt = strata.optim.AdamW([p], lr=1e-2, weight_decay=0.0, rounding="fused",
                             state_dtype=state_dtype)
    for _ in range(steps):
        opt.zero_grad()
        loss = (weight * (p - target) ** 2).sum()
        loss.backward()
        opt.step()
    return p.detach().clone(), float((weight * (p - target) ** 2).sum()), opt


def test_int8_state_holds_codes_and_scales():
    p, _, opt = _fit("int8", steps=2)
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert state["exp_avg"].dtype == torch.uint8 and state["exp_avg"].numel() == 5000
    assert state["exp_avg_sq"].dtype == torch.uint8
    assert state["exp_avg_scale"].numel() == 3  # ceil(5000 / 2048)
    assert state["exp_avg_sq_scale"].numel() == 3
    assert bool((state["exp_avg_sq_scale"] > 0).all())


def test_int8_reruns_to_the_same_bits():
    a, _, _ = _fit("int8", steps=20)
    b, _, _ = _fit("int8", steps=20)
    assert torch.equal(a, b)


def test_int8_trains_like_fp32_states():
    _, loss32, _ = _fit("fp32")
    _, loss8, _ = _fit("int8")
    _, start, _ = _fit("fp32", steps=0)
    assert loss32 < 0.5 * start
    assert loss8 <= 1.05 * loss32, (loss8, loss32)  # no worse than fp32 states


def test_int8_arguments_are_checked():
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(strata.Error, match="state_dtype"):
        strata.optim.AdamW([p], state_dtype="int4")
    with pytest.raises(strata.Error, match="fused"):
        strata.optim.AdamW([p], state_dtype="int8")  # rounding="torch" is fp32 only


def test_int8_state_dict_is_torch_layout_and_continues_the_run_bit_for_bit():
    """state_dict() holds fp32 exp_avg/exp_avg_sq of the parameter's shape (dequantized);
    loaded into a new int8 optimizer they quantize to the same codes and scales, so the run
    continues bit for bit; loaded into an fp32 one (and back) they convert."""
    p, _, opt = _fit("int8", steps=5)
    sd = opt.state_dict()
    st = sd["state"][0]
    assert st["exp_avg"].dtype == torch.float32 and st["exp_avg"].shape == p.shape
    assert st["exp_avg_sq"].dtype == torch.float32 and bool((st["exp_avg_sq"] >= 0).all())
    assert int(st["step"]) == 5
    raw = {k: v.clone() if torch.is_tensor(v) else v
           for k, v in opt.state[opt.param_groups[0]["params"][0]].items()}
    assert raw["exp_avg"].dtype == torch.uint8  # the optimizer itself still holds codes
    q = torch.nn.Parameter(p.clone())
    opt2 = strata.optim.AdamW([q], lr=1e-2, weight_decay=0.0, rounding="fused",
                              state_dtype="int8")
    opt2.load_state_dict(sd)
    s2 = opt2.state[q]
    for k in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"):
        assert torch.equal(s2[k], raw[k]), k
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(5000, generator=g)
    for o, x in ((opt, opt.param_groups[0]["params"][0]), (opt2, q)):
        x.grad = grad.clone()
        o.step()
    assert torch.equal(q.detach(), opt.param_groups[0]["params"][0].detach())
    f = torch.nn.Parameter(p.clone())
    opt32 = strata.optim.AdamW([f], lr=1e-2, weight_decay=0.0, rounding="fused")
    opt32.load_state_dict(sd)  # int8 -> fp32: the dequantized moments
    assert torch.equal(opt32.state[f]["exp_avg"], st["exp_avg"])
    back = strata.optim.AdamW([torch.nn.Parameter(p.clone())], lr=1e-2, rounding="fused",
                              state_dtype="int8")
    back.load_state_dict(opt32.state_dict())  # fp32 -> int8: quantized again
    assert torch.equal(back.state[back.param_groups[0]["params"][0]]["exp_avg"], raw["exp_avg"])


def test_int8_codes_in_a_state_dict_are_loaded_as_codes():
    """A state_dict holding the codes themselves (the optimizer's own .state, not
    state_dict()'s dequantized moments): an int8 optimizer takes them as they are, though
    torch's load_state_dict casts them to fp32 on the way; an fp32 one dequantizes them."""
    p, _, opt = _fit("int8", steps=5)
    x = opt.param_groups[0]["params"][0]
    raw = {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[x].items()}
    sd = {"state": {0: raw}, "param_groups": opt.state_dict()["param_groups"]}
    q = torch.nn.Parameter(p.clone())
    opt2 = strata.optim.AdamW([q], lr=1e-2, weight_decay=0.0, rounding="fused",
                              state_dtype="int8")
    opt2.load_state_dict(sd)
    for k in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"):
        assert opt2.state[q][k].dtype == raw[k].dtype and torch.equal(opt2.state[q][k], raw[k])
    grad = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    for o, y in ((opt, x), (opt2, q)):
        y.grad = grad.clone()
        o.step()
    assert torch.equal(q.detach(), x.detach())
    f = torch.nn.Parameter(p.clone())
    opt32 = strata.optim.AdamW([f], lr=1e-2, weight_decay=0.0, rounding="fused")
    opt32.load_state_dict(sd)
    want = strata.optim._int8_to_float(raw, f)
    assert torch.equal(opt32.state[f]["exp_avg"], want["exp_avg"])
    assert torch.equal(opt32.state[f]["exp_avg_sq"], want["exp_avg_sq"])
    assert "exp_avg_scale" not in opt32.state[f]
