"""A fresh strata.Engine over a folder that holds a run's committed state is refused with the
Python way to continue it, Engine(resume=True), not the CLI's --resume flag, before the model
is offloaded (issue 45 §6)."""
import pytest

import strata
from gpt_model import GPT, batches


def _run(nvme, steps, resume=False):
    engine = strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme], resume=resume)
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=engine)
    opt = strata.optim.AdamW(model.parameters(), lr=2e-2)
    for micro in batches(steps, 1, seed=1):
        for x, y in micro:
            model(x, y).backward()
        opt.step()
    step = engine.resumed_step
    engine.close()
    return step


def test_a_fresh_engine_over_a_committed_run_names_engine_resume(tmp_path):
    _run(tmp_path, 2)
    with pytest.raises(strata.Error) as refused:
        strata.Engine(device_mem="160K", host_mem="400K", nvme=[tmp_path])
    message = str(refused.value)
    assert "already holds a committed engine state (step 2)" in message
    assert f"strata.Engine(nvme=['{tmp_path}', ...], resume=True)" in message
    assert "--resume" not in message
    assert _run(tmp_path, 1, resume=True) == 2  # what the message says works


def test_a_run_killed_at_its_initial_commit_does_not_block_a_fresh_engine(tmp_path):
    """A run killed right after its step-0 commit (the weights, nothing trained) leaves a
    store that a fresh engine takes for its own run (issue 45 §6; before, it was refused as a
    committed run, in Python first and in the engine)."""
    import os
    import subprocess
    import sys
    child = (
        "import sys; sys.path[:0] = sys.argv[2:]\n"
        "import strata\n"
        "from gpt_model import GPT, batches\n"
        "engine = strata.Engine(device_mem='160K', host_mem='400K', nvme=[sys.argv[1]])\n"
        "model = GPT()\n"
        "model = strata.offload(model, blocks=list(model.blocks), engine=engine)\n"
        "opt = strata.optim.AdamW(model.parameters(), lr=2e-2)\n"
        "for micro in batches(1, 1, seed=1):\n"
        "    for x, y in micro:\n"
        "        model(x, y).backward()\n"
        "    opt.step()\n")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, STRATA_TEST_KILL_AT="committed:1")
    killed = subprocess.run([sys.executable, "-c", child, str(tmp_path), here] + sys.path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert strata._strata.peek_committed_step(str(tmp_path)) == 0
    assert _run(tmp_path, 2) == 0  # a fresh run: nothing resumed
    assert _run(tmp_path, 1, resume=True) == 2
