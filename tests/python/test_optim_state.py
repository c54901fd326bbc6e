"""strata.optim.AdamW.state_dict() of an offloaded model holds the moments and the step, read
from the engine, laid out as torch.optim.AdamW's; load_state_dict loads the param_groups'
settings and refuses moments the engine does not hold."""
import pytest
import torch

import strata
from gpt_model import GPT, batches, param_groups

KW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)


def _step(model, opt, steps):
    for micro in batches(steps, 1):
        for x, y in micro:
            model(x, y).backward()
        opt.step()
        opt.zero_grad()


def test_state_dict_holds_the_moments_as_torch_lays_them_out(tmp_path):
    (tmp_path / "n").mkdir()
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=1,
                           engine=strata.Engine(device_mem="160K", host_mem="400K",
                                                nvme=[tmp_path / "n"]))
    opt = strata.optim.AdamW(param_groups(model, 0.1), **KW)
    ref = GPT()
    ref_opt = torch.optim.AdamW(param_groups(ref, 0.1), **KW)
    _step(model, opt, 1)
    _step(ref, ref_opt, 1)
    ours, theirs = opt.state_dict(), ref_opt.state_dict()
    for a, b in zip(ours["param_groups"], theirs["param_groups"]):  # torch adds its flags
        assert a == {k: b[k] for k in a}
    assert sorted(ours["state"]) == sorted(theirs["state"])
    for i, t in theirs["state"].items():
        o = ours["state"][i]
        assert float(o["step"]) == float(t["step"]) == 1.0
        for k in ("exp_avg", "exp_avg_sq"):  # after one step: (1 - beta) g and (1 - beta) g^2
            err = (o[k] - t[k]).abs().max() / t[k].abs().max()
            assert o[k].shape == t[k].shape and err <= 1e-5, (i, k, err)
    _step(model, opt, 2)
    assert {float(s["step"]) for s in opt.state_dict()["state"].values()} == {3.0}


def test_load_state_dict_takes_the_settings_and_refuses_other_moments():
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    opt = strata.optim.AdamW(model.parameters(), **KW)
    _step(model, opt, 1)
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 5e-3
    opt.load_state_dict(sd)  # its own moments: loads, and the lr with them
    assert opt.param_groups[0]["lr"] == 5e-3
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"] + 1
    with pytest.raises(strata.Error, match="moments given differ.*strata.load_checkpoint"):
        opt.load_state_dict(sd)
    sd = opt.state_dict()
    sd["param_groups"][0]["betas"] = (0.8, 0.95)
    with pytest.raises(strata.Error, match=r"betas=\(0.8, 0.95\).*the engine runs betas"):
        opt.load_state_dict(sd)
