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
