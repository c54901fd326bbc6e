"""strata.optim.AdamW(master_dtype="bf16") on plain CPU parameters: a bf16 master (stochastic
rounding or a bf16 Kahan term) with fp32 or int8 moments; the parameter is the master's value,
a rerun gives the same bits, and a fit with updates far below a bf16 ulp still converges."""
import io

import pytest
import torch

import strata
import strata.optim


def _fit(master_rounding, state_dtype="fp32", master_dtype="bf16", steps=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = 1.0 + 0.01 * torch.randn(5000, generator=g)  # near 1: a bf16 ulp is 2^-7
    p = torch.nn.Parameter(torch.ones(5000))
    opt = strata.optim.AdamW([p], lr=1e-4, weight_decay=0.0, rounding="fused",
                             state_dtype=state_dtype, master_dtype=master_dtype,
                             master_rounding=master_rounding)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((p - target) ** 2).sum()
        loss.backward()
        opt.step()
    return p.detach().clone(), float(((p - target) ** 2).sum()), opt


@pytest.mark.parametrize("state_dtype", ["fp32", "int8"])
@pytest.mark.parametrize("rounding", ["stochastic", "kahan"])
def test_bf16_master_state_and_parameter(rounding, state_dtype):
    p, _, opt = _fit(rounding, state_dtype, steps=3)
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert state["master"].dtype == torch.bfloat16 and state["master"].numel() == 5000
    assert ("master_comp" in state) == (rounding == "kahan")
    assert torch.equal(p, state["master"].float())  # the model computes with the master
    a, _, _ = _fit(rounding, state_dtype, steps=20)
    b, _, _ = _fit(rounding, state_dtype, steps=20)
    assert torch.equal(a, b)


@pytest.mark.parametrize("state_dtype", ["fp32", "int8"])
def test_small_updates_survive_a_bf16_master(state_dtype):
    # 200 steps of lr 1e-4 move each weight by up to 0.02, a few bf16 ulps, in steps of 1e-4:
    # a bf16 master rounded to nearest would never move. Both methods follow fp32 closely.
    _, start, _ = _fit("kahan", state_dtype, steps=0)
    _, fp32, _ = _fit("kahan", state_dtype, master_dtype="fp32")
    for rounding in ("stochastic", "kahan"):
        _, loss, _ = _fit(rounding, state_dtype)
        assert loss < 0.5 * start
        assert abs(loss - fp32) < 0.25 * (start - fp32), (rounding, loss, fp32, start)


def test_master_arguments_are_checked():
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(strata.Error, match="master_dtype"):
        strata.optim.AdamW([p], rounding="fused", master_dtype="fp16")
    with pytest.raises(strata.Error, match="master_rounding"):
        strata.optim.AdamW([p], rounding="fused", master_dtype="bf16", master_rounding="nearest")
    with pytest.raises(strata.Error, match="fused"):
        strata.optim.AdamW([p], master_dtype="bf16")


def _continue(p, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = 1.0 + 0.01 * torch.randn(5000, generator=g)  # _fit's
    for _ in range(steps):
        opt.zero_grad()
        ((p - target) ** 2).sum().backward()
        opt.step()


@pytest.mark.parametrize("state_dtype", ["fp32", "int8"])
@pytest.mark.parametrize("rounding", ["stochastic", "kahan"])
def test_a_saved_bf16_master_loads_and_continues_bit_for_bit(rounding, state_dtype):
    """state_dict() holds the bf16 "master" (and "master_comp") as they are, int8 moments or
    not; torch.save, torch.load and load_state_dict into a new optimizer (torch's casts its
    state to the parameter's fp32) give them back as bf16, so the run goes on as if it had not
    stopped."""
    straight, _, opt = _fit(rounding, state_dtype, steps=6)
    p, _, opt = _fit(rounding, state_dtype, steps=3)
    raw = dict(opt.state[opt.param_groups[0]["params"][0]])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    sd = torch.load(io.BytesIO(buf.getvalue()))
    st = sd["state"][0]
    assert st["master"].dtype == torch.bfloat16 and torch.equal(st["master"], raw["master"])
    assert ("master_comp" in st) == (rounding == "kahan")
    q = torch.nn.Parameter(p.clone())
    resumed = strata.optim.AdamW([q], lr=1e-4, weight_decay=0.0, rounding="fused",
                                 state_dtype=state_dtype, master_dtype="bf16",
                                 master_rounding=rounding)
    resumed.load_state_dict(sd)
    for k, v in resumed.state[q].items():
        if torch.is_tensor(raw[k]):
            assert v.dtype == raw[k].dtype and torch.equal(v, raw[k]), k
    _continue(q, resumed, 3)
    assert torch.equal(q.detach(), straight)


def test_a_master_of_another_dtype_is_refused_at_the_kernel():
    p = torch.nn.Parameter(torch.ones(8))
    opt = strata.optim.AdamW([p], rounding="fused", master_dtype="bf16")
    p.grad = torch.ones(8)
    opt.step()
    opt.state[p]["master"] = opt.state[p]["master"].float()  # as torch's cast left it
    with pytest.raises(strata.Error, match="'master'.*torch.float32.*torch.bfloat16"):
        opt.step()
