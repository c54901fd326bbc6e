"""strata.optim.AdamW.state_dict() of an offloaded model holds the moments and the step, read
from the engine, laid out as torch.optim.AdamW's; load_state_dict loads the param_groups'
settings and writes the moments into the engine, so that a new optimizer continues the run."""
import json
import struct

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


def _weights_file(model, path):
    strata.save_safetensors(model, path)
    with open(path, "rb") as f:
        return f.read()


def _two_steps_saved(engine, data, weights_path):
    """A GPT offloaded into `engine` and trained on data[0] and data[1]; its optimizer's
    state_dict() after them, and its weights written to weights_path."""
    a = GPT()
    a = strata.offload(a, blocks=list(a.blocks), engine=engine)
    opt_a = strata.optim.AdamW(param_groups(a, 0.1), **GROUPS_KW)
    for x, y in data[0] + data[1]:
        a(x, y).backward()
        opt_a.step()
    saved = opt_a.state_dict()
    _weights_file(a, weights_path)
    return a, opt_a, saved


def _load_weights(model, path):
    """A plain model's parameters from save_safetensors' file (tied ones are written once)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    with torch.no_grad():
        for name, p in model.named_parameters():
            a, b = header[name]["data_offsets"]
            p.copy_(torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]),
                                     dtype=torch.float32).view(p.shape))


GROUPS_KW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, max_grad_norm=1.0)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_load_state_dict_into_a_new_optimizer_continues_the_run_bit_for_bit(tmp_path,
                                                                             state_dtype):
    """The moments of step 2, saved with state_dict and loaded with the weights into a new
    model, engine and optimizer (tight NVMe budgets, the engine's step count at 0), give
    step 3 exactly as the uninterrupted run does: losses, weights and moments."""
    data = list(batches(3, 1))
    a, opt_a, saved = _two_steps_saved(strata.Engine(state_dtype=state_dtype), data,
                                       tmp_path / "w2.st")
    (x, y), = data[2]
    loss_a = a(x, y)
    loss_a.backward()
    opt_a.step()

    (tmp_path / "n").mkdir()
    b = GPT(seed=5)  # other values: all of them come from the files
    _load_weights(b, tmp_path / "w2.st")
    b = strata.offload(b, blocks=list(b.blocks), engine=strata.Engine(
        device_mem="160K", host_mem="400K", nvme=[tmp_path / "n"], state_dtype=state_dtype))
    opt_b = strata.optim.AdamW(param_groups(b, 0.1), lr=0.5, betas=(0.5, 0.5), eps=1.0,
                               max_grad_norm=1.0)  # not in a state_dict (torch has none)
    opt_b.load_state_dict(saved)  # the settings too: lr, betas, eps, weight_decay
    assert opt_b.param_groups[0]["betas"] == (0.9, 0.95)
    loss_b = b(x, y)
    loss_b.backward()
    opt_b.step()
    assert loss_b.item() == loss_a.item()
    assert _weights_file(b, tmp_path / "b.st") == _weights_file(a, tmp_path / "a.st")
    ours, theirs = opt_b.state_dict()["state"], opt_a.state_dict()["state"]
    for i in theirs:
        assert float(ours[i]["step"]) == float(theirs[i]["step"]) == 3.0
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(ours[i][k], theirs[i][k]), (i, k)


def test_load_state_dict_refuses_partial_or_mismatched_moments():
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    opt = strata.optim.AdamW(model.parameters(), **KW)
    _step(model, opt, 1)
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 5e-3
    opt.load_state_dict(sd)  # its own moments: loads, and the lr with them
    assert opt.param_groups[0]["lr"] == 5e-3
    partial = dict(sd, state={i: s for i, s in sd["state"].items() if i != 3})
    with pytest.raises(strata.Error, match=r"moments for \d+ of the \d+ parameters"):
        opt.load_state_dict(partial)
    steps = dict(sd, state={i: dict(s, step=torch.tensor(float(i % 2 + 1)))
                            for i, s in sd["state"].items()})
    with pytest.raises(strata.Error, match="steps differ"):
        opt.load_state_dict(steps)
    wrong = dict(sd, state=dict(sd["state"]))
    wrong["state"][0] = dict(wrong["state"][0], exp_avg=torch.zeros(3))
    with pytest.raises(strata.Error, match="exp_avg of .* has shape \\(3,\\)"):
        opt.load_state_dict(wrong)
    with pytest.raises(strata.Error, match="param groups differ"):
        opt.load_state_dict(dict(sd, param_groups=sd["param_groups"] * 2))
    # Nothing was written by the refusals: the moments are still the engine's own.
    after = opt.state_dict()["state"]
    for i, s in sd["state"].items():
        assert torch.equal(after[i]["exp_avg"], s["exp_avg"])


def test_a_run_that_loaded_moments_resumes_in_a_new_engine_with_their_step_count(tmp_path):
    """optimizer.load_state_dict's moments count the steps of the run that made them (2 here);
    the engine counts its own, and the layer adds the difference (step_offset, in Python). After
    one more step, a new engine resumed from the NVMe folder (as a new process would) must
    count as the run did: step 4 equals the uninterrupted run's, bit for bit. It does because
    the engine commits the bias correction's count (its steps + the offset) as the store's
    step, so the resumed engine starts from it with no offset to restore."""
    data = list(batches(4, 1))
    a, opt_a, saved = _two_steps_saved(strata.Engine(), data, tmp_path / "w2.st")
    for x, y in data[2] + data[3]:
        a(x, y).backward()
        opt_a.step()

    (tmp_path / "n").mkdir()
    budgets = dict(device_mem="160K", host_mem="400K", nvme=[tmp_path / "n"])
    b = GPT(seed=5)
    _load_weights(b, tmp_path / "w2.st")
    engine_b = strata.Engine(**budgets)
    b = strata.offload(b, blocks=list(b.blocks), engine=engine_b)
    opt_b = strata.optim.AdamW(param_groups(b, 0.1), **GROUPS_KW)
    opt_b.load_state_dict(saved)
    (x, y), = data[2]
    b(x, y).backward()
    opt_b.step()
    engine_b.close()  # as a killed process leaves it: step 3 committed

    c = GPT(seed=7)  # every value comes from the store
    c = strata.offload(c, blocks=list(c.blocks), engine=strata.Engine(resume=True, **budgets))
    opt_c = strata.optim.AdamW(param_groups(c, 0.1), **GROUPS_KW)
    (x, y), = data[3]
    c(x, y).backward()
    opt_c.step()
    assert _weights_file(c, tmp_path / "c.st") == _weights_file(a, tmp_path / "a.st")
    assert all(float(s["step"]) == 4.0 for s in opt_c.state_dict()["state"].values())


@pytest.mark.parametrize("clip", [True, False])
def test_older_moments_into_a_store_that_counted_further_are_refused_first(tmp_path, clip):
    """A store commits each step under the bias correction's count (so a resumed engine goes on
    counting), and its steps only increase: moments of step 2 loaded into an engine whose store
    has counted 4 steps would make the next commit go back. With clipping (updates deferred to
    the next step) that commit failed mid-step and the engine stopped; without it the step ran
    and the store's count lost the load's. Now the load is refused before anything changes, and
    the run goes on; an engine without NVMe folders takes the older moments."""
    kw = dict(GROUPS_KW) if clip else dict(GROUPS_KW, max_grad_norm=0.0)
    data = list(batches(6, 1))
    (tmp_path / "n").mkdir()
    a = GPT()
    a = strata.offload(a, blocks=list(a.blocks), engine=strata.Engine(
        device_mem="160K", host_mem="400K", nvme=[tmp_path / "n"]))
    opt = strata.optim.AdamW(param_groups(a, 0.1), **kw)
    saved = None
    for i in range(4):
        (x, y), = data[i]
        a(x, y).backward()
        opt.step()
        if i == 1:
            saved = opt.state_dict()
    before = opt.state_dict()
    with pytest.raises(strata.Error, match="of step 2.*counted 4 steps"):
        opt.load_state_dict(saved)
    after = opt.state_dict()
    for i in before["state"]:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(before["state"][i][k], after["state"][i][k]), (i, k)
    (x, y), = data[4]
    a(x, y).backward()
    opt.step()  # the run goes on
    assert all(float(s["step"]) == 5.0 for s in opt.state_dict()["state"].values())

    b = GPT()
    b = strata.offload(b, blocks=list(b.blocks), engine=strata.Engine())
    opt_b = strata.optim.AdamW(param_groups(b, 0.1), **kw)
    _step(b, opt_b, 4)
    opt_b.load_state_dict(saved)
    assert all(float(s["step"]) == 2.0 for s in opt_b.state_dict()["state"].values())
