"""A checkpoint saved on 2 ranks loaded on 1, 3 and 4, and one saved on 4 loaded on 2 (each rank
reads its new shards from the saved ranks' files): the weights and moments after the load are
those of the save bit for bit, and the losses go on as a run on the new number of ranks that
was never interrupted (within 1e-6 relative: the ranks' gradients are averaged in another
order). A re-sharded load trained on and then resumed in new processes (Engine(resume=True))
counts its steps on: the resumed step is the load's plus the one trained, and the loss after it
is the uninterrupted run's. test_checkpoint.py has 2 ranks loaded on 2 and on 1 (the weights), and
test_checkpoint_reshard.py one rank going on from a 2-rank checkpoint as the run it was saved
from (a checkpoint cut into ranks' files in one process)."""
import json

import pytest
import torch

from checkpoint_run import ranks

CHILD = "reshard_ranks_child.py"


def _launch(tmp_path, mode, world, name, ckpt, fresh=True):
    for r in range(world):
        if fresh:
            (tmp_path / f"{name}-nvme{r}").mkdir()
    for code, err in ranks(tmp_path, CHILD, mode, tmp_path / f"{name}-nvme{{rank}}", ckpt,
                           tmp_path / name, world=world, timeout=120, limit=300):
        assert code == 0, err[-3000:]
    losses = [json.loads((tmp_path / f"{name}{r}.json").read_text()) for r in range(world)]
    return [sum(step) / world for step in zip(*losses)]  # each rank's loss is its rows' mean


def _states(tmp_path, name):
    return ((tmp_path / f"{name}.safetensors").read_bytes(),
            torch.load(tmp_path / f"{name}.moments"))


@pytest.mark.slow  # up to 10 processes started for a case (half a minute each)
@pytest.mark.parametrize("saved, loaded", [(2, 1), (2, 3), (2, 4), (4, 2)])
def test_a_checkpoint_loads_exactly_on_another_number_of_ranks(tmp_path, saved, loaded):
    ckpt = tmp_path / "ckpt"
    _launch(tmp_path, "save", saved, "save", ckpt)
    resumed = _launch(tmp_path, "load", loaded, "load", ckpt)
    want, got = _states(tmp_path, "save"), _states(tmp_path, "load")
    assert got[0] == want[0]
    assert got[1].keys() == want[1].keys()
    for i in want[1]:
        for k in want[1][i]:
            assert torch.equal(torch.as_tensor(got[1][i][k]), torch.as_tensor(want[1][i][k])), \
                (i, k)
    straight = _launch(tmp_path, "run", loaded, "run", ckpt)
    assert len(resumed) == 2 and len(straight) == 5
    for a, b in zip(resumed, straight[3:]):
        assert abs(a - b) <= 1e-6 * abs(b), (resumed, straight)


@pytest.mark.slow
def test_a_resharded_load_trained_on_resumes_in_new_processes(tmp_path):
    ckpt = tmp_path / "ckpt"
    _launch(tmp_path, "save", 2, "save", ckpt)
    first = _launch(tmp_path, "load-one", 1, "load", ckpt)
    # the same folder as the load's: the store it committed step 4 into; steps 5 and 6 (the
    # loss of step 6 is the first that step 5's update, and so its bias correction, shapes)
    second = _launch(tmp_path, "resume", 1, "load", None, fresh=False)
    straight = _launch(tmp_path, "run6", 1, "run", ckpt)
    assert len(first) == 1 and len(second) == 2 and len(straight) == 6
    for a, b in zip(first + second, straight[3:]):
        assert abs(a - b) <= 1e-6 * abs(b), (first, second, straight)
