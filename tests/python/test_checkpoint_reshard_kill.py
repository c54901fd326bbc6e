"""SIGKILL at a random moment of a re-sharding load_checkpoint (a two-rank checkpoint loaded on
one rank) or of the first step after it, which commits the loaded state: the checkpoint is
unchanged, the run's store resumes at its last commit (the step before the load, the loaded
state, or the step after it, each with its own step count), and a load in a fresh process is
still exact."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import strata
from checkpoint_run import as_ranks, files, offloaded_run, train

HERE = os.path.dirname(os.path.abspath(__file__))


def _state(model, opt, path):
    """The weights (as save_safetensors writes them) and the moments and steps."""
    strata.save_safetensors(model, path)
    return path.read_bytes(), {i: {k: torch.as_tensor(v).clone() for k, v in s.items()}
                               for i, s in opt.state_dict()["state"].items()}


def _same(a, b, what):
    assert a[0] == b[0], what
    assert a[1].keys() == b[1].keys(), what
    for i in a[1]:
        assert a[1][i].keys() == b[1][i].keys(), what
        for k in a[1][i]:
            assert torch.equal(a[1][i][k], b[1][i][k]), (what, i, k)


def _child(nvme, ckpt, kill_after=None):
    """reshard_kill_child.py over `nvme`; killed `kill_after` seconds after it starts loading
    (None: it runs to the end). Returns the seconds from its "loading" to its "done" (None when
    it was killed first)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "reshard_kill_child.py"),
                          str(nvme), str(ckpt)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line == "loading\n", line + p.stderr.read()[-3000:]
        t0 = time.monotonic()
        if kill_after is not None:
            time.sleep(kill_after)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
            return None
        line = p.stdout.readline()
        assert line == "done\n", line + p.stderr.read()[-3000:]
        took = time.monotonic() - t0
        assert p.wait(timeout=60) == 0, p.stderr.read()[-3000:]
        return took
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


@pytest.mark.slow  # six processes started (about half a minute)
def test_a_resharding_load_killed_at_random_moments_loses_nothing(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    a, opt_a = offloaded_run(theirs, "1M", "2M")
    train(a, opt_a, 3, seed=1)
    ckpt = tmp_path / "ckpt"
    as_ranks(a, ckpt, 2, client_state={"epoch": 7})
    saved = files(ckpt)
    want = _state(a, opt_a, tmp_path / "want.safetensors")
    # What the child's store holds at each of its commits: before the load, after the step
    # that follows it.
    (tmp_path / "ref").mkdir()
    ref, opt_ref = offloaded_run(tmp_path / "ref", "1M", "2M")
    train(ref, opt_ref, 1, seed=3)
    before = _state(ref, opt_ref, tmp_path / "before.safetensors")
    strata.load_checkpoint(ref, ckpt)
    train(ref, opt_ref, 1, seed=2)
    after = _state(ref, opt_ref, tmp_path / "after.safetensors")

    (tmp_path / "whole").mkdir()
    took = _child(tmp_path / "whole", ckpt)  # how long a load and its step take here
    rng = random.Random(43)
    trials = [rng.uniform(0, took * 1.2) for _ in range(5)]
    for t, kill_after in enumerate([None] + trials):
        nvme = tmp_path / f"run{t}"
        if kill_after is not None:
            nvme.mkdir()
            _child(nvme, ckpt, kill_after)
        else:
            nvme = tmp_path / "whole"
        what = f"killed {kill_after} s into the load (it takes {took:.3f} s)"
        assert files(ckpt) == saved, what
        model, opt = offloaded_run(nvme, "1M", "2M", engine_options={"resume": True})
        resumed = next(model.parameters())._strata_offload.engine.resumed_step
        # The store counts steps as the bias correction does: the loaded state is step 3 (the
        # next step's start commits it) and the step after it 4.
        assert resumed in (1, 3, 4), (what, resumed)
        got = _state(model, opt, tmp_path / "w.safetensors")
        _same(got, {1: before, 3: want, 4: after}[resumed], what)
        if resumed == 4:  # the store has counted past the checkpoint's step 3: refused first
            with pytest.raises(strata.Error, match="of step 3.*counted 4 steps"):
                strata.load_checkpoint(model, ckpt)
            _same(_state(model, opt, tmp_path / "w.safetensors"), after, what)
            continue
        assert strata.load_checkpoint(model, ckpt) == {"epoch": 7}, what
        _same(_state(model, opt, tmp_path / "w.safetensors"), want, what)
        train(model, opt, 1, seed=2)
        _same(_state(model, opt, tmp_path / "w.safetensors"), after, what)
