"""Param groups of an offloaded model: each group's lr, betas, eps and weight_decay update its
parameters (the engine's StepArgs.groups, read from param_groups at every step, so schedulers
that change them keep working), as torch.optim.AdamW with the same groups does."""
import pytest
import torch

import strata
from gpt_model import GPT, batches

STEPS, MICRO, CLIP = 8, 2, 1.0


def _groups(model):
    """Matrices in one group, biases and norms in another: every setting differs."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "lr": 2e-2, "betas": (0.9, 0.95), "weight_decay": 0.1},
            {"params": rest, "lr": 5e-3, "betas": (0.8, 0.99), "eps": 1e-6,
             "weight_decay": 0.02}]


# One lambda per group: the groups' lr ratio changes every step.
_LAMBDAS = [lambda s: min(1.0, (s + 1) / 3), lambda s: 1.0 / (s + 1)]


def _train(model, opt, clip_torch):
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _LAMBDAS)
    losses = []
    for micro in batches(STEPS, MICRO):
        for x, y in micro:
            loss = model(x, y)
            (loss / MICRO).backward()
            losses.append(loss.item())
        if clip_torch:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
    return losses


def _strata(engine):
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, micro_batches=MICRO)
    opt = strata.optim.AdamW(_groups(model), max_grad_norm=CLIP)
    return model, _train(model, opt, False), opt


def _weights(model, path):
    strata.save_safetensors(model, path)
    with open(path, "rb") as f:
        return f.read()


def test_groups_with_their_own_lr_betas_and_decay_train_as_torch_adamw(tmp_path):
    (tmp_path / "n").mkdir()
    m_off, off, _ = _strata(strata.Engine(device_mem="160K", host_mem="400K",
                                          nvme=[tmp_path / "n"]))
    m_mem, mem, opt = _strata(strata.Engine())
    ref = GPT()
    ref_opt = torch.optim.AdamW(_groups(ref))
    theirs = _train(ref, ref_opt, True)
    assert off == mem  # the budgets change nothing, bit for bit
    assert _weights(m_off, tmp_path / "a.st") == _weights(m_mem, tmp_path / "b.st")
    # test_offload's tolerance for the engine's AdamW against torch's.
    for a, b in zip(off, theirs):
        assert abs(a - b) <= 1e-4 * abs(b), (off, theirs)
    w = dict(ref.named_parameters())["wte.weight"].detach()
    assert (strata_params(m_mem)["wte.weight"] - w).abs().max() <= 1e-3 * w.abs().max()
    # The moments too, as torch lays them out (their rounding differs by ulps of the update).
    ours, want = opt.state_dict(), ref_opt.state_dict()
    for g, h in zip(ours["param_groups"], want["param_groups"]):
        assert g["lr"] == h["lr"] and g["betas"] == h["betas"] and g["eps"] == h["eps"]
    i = 0  # wte.weight: the first parameter of the first group
    for k in ("exp_avg", "exp_avg_sq"):
        o, t = ours["state"][i][k], want["state"][i][k]
        assert (o - t).abs().max() <= 1e-3 * t.abs().max(), k


def test_a_group_change_between_steps_applies_to_the_next_step():
    """Setting a group's weight_decay and betas between steps, as a scheduler could: with lr 0
    for one group its weights stay put while the other group's move."""
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    opt = strata.optim.AdamW(_groups(model))
    data = list(batches(2, 1))
    (x, y), = data[0]
    model(x, y).backward()
    opt.step()
    before = {n: t.clone() for n, t in strata_params(model).items()}
    opt.param_groups[1]["lr"] = 0.0
    opt.param_groups[0]["betas"] = (0.5, 0.6)
    (x, y), = data[1]
    model(x, y).backward()
    opt.step()
    after = strata_params(model)
    rest = {n for n, p in GPT().named_parameters() if p.dim() < 2}
    for n, t in after.items():
        if n in rest:
            assert torch.equal(t, before[n]), n
        else:
            assert not torch.equal(t, before[n]), n


def strata_params(model):
    state = next(model.parameters())._strata_offload
    return {n: t.clone() for n, t in state.gather().items()}


def test_a_bad_group_setting_is_refused_at_the_next_forward():
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    opt = strata.optim.AdamW(_groups(model))
    opt.param_groups[1]["betas"] = (0.9, 1.5)
    (x, y), = next(batches(1, 1))
    with pytest.raises(strata.Error, match="optimizer group 1 out of range"):
        model(x, y)
