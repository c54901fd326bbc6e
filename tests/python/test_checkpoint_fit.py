"""strata.load_checkpoint of a checkpoint that does not fit the live run (other layers, another
width, another state_dtype, a damaged or inconsistent checkpoint) is refused before any byte of
the run's state changes: the engine is left exactly as it was (its NVMe files byte for byte, its
weights and moments) and trains on. It used to replace the run's state first, then fail to
reopen, and the run was gone (issue 45 §1)."""
import json

import pytest
import torch

import strata
from checkpoint_run import files as _files, offloaded_run, train as _train


def _run(nvme, engine_options=None, **model_options):
    nvme.mkdir()
    return offloaded_run(nvme, "1M", "2M", engine_options, **model_options)


def _state(model, opt, nvme, tmp_path):
    """Everything a load could change: the NVMe folder's files, the weights, the moments, the
    step and the optimizer's settings."""
    strata.save_safetensors(model, tmp_path / "w.safetensors")
    sd = opt.state_dict()
    return (_files(nvme), (tmp_path / "w.safetensors").read_bytes(),
            {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for i, s in sd["state"].items()},
            [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]])


def _same(a, b):
    assert a[0] == b[0]  # the committed state's files, byte for byte
    assert a[1] == b[1]  # the weights
    assert a[2].keys() == b[2].keys() and a[3] == b[3]
    for i in a[2]:
        for k in a[2][i]:
            assert torch.equal(torch.as_tensor(a[2][i][k]), torch.as_tensor(b[2][i][k])), (i, k)


def _damage_swap(ckpt):
    swap = ckpt / "nvme0" / "strata.swap.0-of-1"
    data = bytearray(swap.read_bytes())
    data[100] ^= 0xFF  # the first extent's bytes
    swap.write_bytes(bytes(data))


def _damage_manifest(ckpt):
    m = ckpt / "nvme0" / "strata.manifest"
    data = bytearray(m.read_bytes())
    data[-3] ^= 0xFF
    m.write_bytes(bytes(data))


def _other_step(ckpt):
    meta = json.loads((ckpt / "strata.json").read_text())
    meta["step"] += 1
    (ckpt / "strata.json").write_text(json.dumps(meta))


CASES = {
    "fewer layers": ({}, {"layers": 2}, None, "blocks.2.attn_proj.bias is not in this model"),
    "more layers": ({}, {"layers": 4}, None, "blocks.3.attn_proj.bias is missing there"),
    "another width": ({}, {"dim": 64}, None, r"is \[32\] there, \[64\] here"),
    "another state_dtype": ({"state_dtype": "bf16"}, {}, None, "does not fit this engine"),
    "a damaged swap file": ({}, {}, _damage_swap, "is damaged: nvme0/strata.swap.0-of-1 has"),
    "a damaged manifest": ({}, {}, _damage_manifest, "cannot be loaded.*anifest"),
    "steps that disagree": ({}, {}, _other_step, "inconsistent: strata.json says step"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_load_that_does_not_fit_leaves_the_run_exactly_as_it_was(tmp_path, case):
    engine_options, model_options, damage, message = CASES[case]
    model, opt = _run(tmp_path / "saved")
    _train(model, opt, 2, seed=1)
    ckpt = tmp_path / "ckpt"
    strata.save_checkpoint(model, ckpt, opt)
    if damage:
        damage(ckpt)
    in_ckpt = _files(ckpt / "nvme0")

    live, live_opt = _run(tmp_path / "live", engine_options, **model_options)
    _train(live, live_opt, 3, seed=2)
    before = _state(live, live_opt, tmp_path / "live", tmp_path)
    with pytest.raises(strata.Error, match=message) as failed:
        strata.load_checkpoint(live, ckpt, live_opt)
    assert "nothing was changed" in str(failed.value)
    _same(_state(live, live_opt, tmp_path / "live", tmp_path), before)
    assert _files(ckpt / "nvme0") == in_ckpt  # the check leaves nothing in the checkpoint
    _train(live, live_opt, 1, seed=3)  # the run goes on


def test_a_load_that_fits_still_continues_the_run(tmp_path):
    """The checks pass a checkpoint of the same model: after the load the run is the saved
    one's, bit for bit."""
    model, opt = _run(tmp_path / "saved")
    _train(model, opt, 2, seed=1)
    strata.save_checkpoint(model, tmp_path / "ckpt", opt)
    _train(model, opt, 1, seed=3)
    strata.save_safetensors(model, tmp_path / "straight.safetensors")
    live, live_opt = _run(tmp_path / "live")
    _train(live, live_opt, 3, seed=2)
    strata.load_checkpoint(live, tmp_path / "ckpt", live_opt)
    _train(live, live_opt, 1, seed=3)
    strata.save_safetensors(live, tmp_path / "loaded.safetensors")
    assert ((tmp_path / "loaded.safetensors").read_bytes()
            == (tmp_path / "straight.safetensors").read_bytes())
