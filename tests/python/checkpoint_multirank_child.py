"""One rank of test_checkpoint.py's two-rank run (launcher variables set by the test):
`save NVME CKPT OUT` trains 3 steps on this rank's rows, saves a checkpoint (every rank its
shard), trains 2 more and writes the weights to OUT; `load NVME CKPT OUT` builds the model
anew, loads the checkpoint and trains the same 2 steps.
`loadfail NVME CKPT OUT` and `savefail NVME CKPT OUT` expect the load or the save to fail (a
shard the test removed; rank 1's shard write failing with ENOSPC, injected here) and write the
error's message to OUT."""
import errno
import os
import sys

import torch

import strata
from gpt_model import GPT, batches, param_groups


def expect_failure(mode, nvme, ckpt, out):
    eng = strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme])
    rank = int(os.environ["RANK"])
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2, engine=eng)
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, max_grad_norm=1.0)
    if mode == "savefail":  # one step, so that there is a run to save
        for x, y in next(batches(1, 2)):
            (model(x[rank * 2:rank * 2 + 2], y[rank * 2:rank * 2 + 2]) / 2).backward()
        opt.step()
    if mode == "savefail" and rank == 1:
        real_save = torch.save

        def save(obj, f, *a, **kw):  # the injected fault: this rank's disk is full
            if str(f).endswith("rank1.pt"):
                raise OSError(errno.ENOSPC, "No space left on device", str(f))
            return real_save(obj, f, *a, **kw)
        torch.save = save
    try:
        if mode == "loadfail":
            strata.load_checkpoint(model, ckpt)
        else:
            strata.save_checkpoint(model, ckpt)
    except (strata.Error, OSError) as e:
        with open(out, "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return
    sys.exit(f"{mode} did not fail on rank {rank}")


def main(mode, nvme, ckpt, out):
    if mode.endswith("fail"):
        return expect_failure(mode, nvme, ckpt, out)
    eng = strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme])
    rank = int(os.environ["RANK"])
    model = GPT(dropout=0.1, seed=rank + (10 if mode == "load" else 0))
    torch.manual_seed(100 + rank)  # each rank's own dropout stream
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2, engine=eng)
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    assert (eng.rank, eng.world_size) == (rank, 2)
    world = eng.world_size
    steps = list(batches(5, 2))
    if mode == "load":
        got = strata.load_checkpoint(model, ckpt, lr_scheduler=sched)
        assert got == {"epoch": 7}, got
        assert opt.state_dict()["state"][0]["step"] == 3
        steps = steps[3:]
    rows = 4 // world
    for i, micro in enumerate(steps):
        if mode == "save" and i == 3:
            strata.save_checkpoint(model, ckpt, lr_scheduler=sched, client_state={"epoch": 7})
        for x, y in micro:
            x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
            (model(x, y) / 2).backward()
        opt.step()
        sched.step()
    strata.save_safetensors(model, out)  # a collective: every rank gathers


if __name__ == "__main__":
    main(*sys.argv[1:])
