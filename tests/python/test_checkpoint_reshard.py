"""A multi-rank checkpoint loaded on one rank (re-sharded from the ranks' files): the next
save_checkpoint holds what was loaded, though the engine commits it only with the next step
(it used to copy the engine's committed state, the run from before the load); and a multi-rank
checkpoint of another model is refused before any byte of the run's state changes (its states
used to be cut or zero-padded to this model's sizes)."""
import re

import pytest
import torch

import strata
from checkpoint_run import as_ranks, files as _files, offloaded_run, train as _train


def _run(nvme, **model_options):
    nvme.mkdir()
    return offloaded_run(nvme, "1M", "2M", **model_options)


def _state(model, opt, path):
    """The weights (as save_safetensors writes them) and the moments and steps."""
    strata.save_safetensors(model, path)
    return path.read_bytes(), {i: {k: torch.as_tensor(v).clone() for k, v in s.items()}
                               for i, s in opt.state_dict()["state"].items()}


def _same(a, b):
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for i in a[1]:
        assert a[1][i].keys() == b[1][i].keys()
        for k in a[1][i]:
            assert torch.equal(a[1][i][k], b[1][i][k]), (i, k)


def test_a_resharded_load_is_what_the_next_save_holds(tmp_path):
    a, opt_a = _run(tmp_path / "a")
    _train(a, opt_a, 3, seed=1)
    as_ranks(a, tmp_path / "two", 2, client_state={"epoch": 7})
    want = _state(a, opt_a, tmp_path / "a.safetensors")
    b, opt_b = _run(tmp_path / "b", seed=5)
    assert strata.load_checkpoint(b, tmp_path / "two") == {"epoch": 7}
    _same(_state(b, opt_b, tmp_path / "b.safetensors"), want)
    strata.save_checkpoint(b, tmp_path / "one", client_state={"epoch": 8})
    c, opt_c = _run(tmp_path / "c", seed=6)
    assert strata.load_checkpoint(c, tmp_path / "one") == {"epoch": 8}
    _same(_state(c, opt_c, tmp_path / "c.safetensors"), want)
    for model, opt in ((a, opt_a), (b, opt_b), (c, opt_c)):
        _train(model, opt, 1, seed=2)
    after = _state(a, opt_a, tmp_path / "a.safetensors")
    _same(_state(b, opt_b, tmp_path / "b.safetensors"), after)
    _same(_state(c, opt_c, tmp_path / "c.safetensors"), after)


@pytest.mark.parametrize("other, message", [
    ({"dim": 64}, r"blocks\.0\.attn_proj\.bias is \[64\] there, \[32\] here"),
    ({"layers": 4}, r"blocks\.3\.attn_proj\.bias is not in this model"),
    ({"layers": 2}, r"blocks\.2\.attn_proj\.bias is missing there"),
], ids=["another width", "more layers", "fewer layers"])
def test_a_resharded_checkpoint_of_another_model_changes_nothing(tmp_path, other, message):
    theirs, opt_theirs = _run(tmp_path / "theirs", **other)
    _train(theirs, opt_theirs, 2, seed=1)
    as_ranks(theirs, tmp_path / "ckpt", 2)
    model, opt = _run(tmp_path / "ours")
    _train(model, opt, 2, seed=3)
    before = _files(tmp_path / "ours"), _state(model, opt, tmp_path / "w.safetensors")
    file = str(tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(strata.Error, match=re.escape(file) + ".*" + message):
        strata.load_checkpoint(model, tmp_path / "ckpt")
    assert _files(tmp_path / "ours") == before[0]
    _same(_state(model, opt, tmp_path / "w.safetensors"), before[1])
    _train(model, opt, 1, seed=4)  # it trains on


@pytest.mark.parametrize("damaged", ['{"step": 2, "world_si', "[]"])
def test_a_damaged_strata_json_is_an_error_naming_it(tmp_path, damaged):
    """A multi-rank checkpoint whose strata.json is damaged, loaded on one rank: strata.Error
    naming the file, and nothing changed (it used to be taken for a single-rank checkpoint and
    refused as one saved by another number of ranks)."""
    theirs, opt_theirs = _run(tmp_path / "theirs")
    _train(theirs, opt_theirs, 2, seed=1)
    as_ranks(theirs, tmp_path / "ckpt", 2)
    (tmp_path / "ckpt" / "strata.json").write_text(damaged)
    model, opt = _run(tmp_path / "ours")
    _train(model, opt, 1, seed=3)
    before = _files(tmp_path / "ours"), _state(model, opt, tmp_path / "w.safetensors")
    with pytest.raises(strata.Error, match=re.escape(str(tmp_path / "ckpt" / "strata.json"))
                       + " is damaged"):
        strata.load_checkpoint(model, tmp_path / "ckpt")
    assert _files(tmp_path / "ours") == before[0]
    _same(_state(model, opt, tmp_path / "w.safetensors"), before[1])


def test_a_save_right_after_optimizer_load_state_dict_holds_the_loaded_moments(tmp_path):
    """optimizer.load_state_dict writes the moments into the engine, committed with the next
    step; a save_checkpoint before it holds them (it used to copy the committed moments, with
    the loaded state's step count)."""
    a, opt_a = _run(tmp_path / "a")
    _train(a, opt_a, 3, seed=1)
    b, opt_b = _run(tmp_path / "b")
    _train(b, opt_b, 1, seed=7)
    opt_b.load_state_dict(opt_a.state_dict())
    want = opt_b.state_dict()["state"]
    strata.save_checkpoint(b, tmp_path / "ckpt")
    c, opt_c = _run(tmp_path / "c")
    strata.load_checkpoint(c, tmp_path / "ckpt")
    got = opt_c.state_dict()["state"]
    assert got.keys() == want.keys()
    for i in want:
        for k in want[i]:
            assert torch.equal(torch.as_tensor(got[i][k]), torch.as_tensor(want[i][k])), (i, k)
