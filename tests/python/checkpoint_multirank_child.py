"""One rank of test_checkpoint.py's two-rank run (launcher variables set by the test):
`save NVME CKPT OUT` trains 3 steps on this rank's rows, saves a checkpoint (every rank its
shard), trains 2 more and writes the weights to OUT; `load NVME CKPT OUT` builds the model
anew, loads the checkpoint and trains the same 2 steps."""
import os
import sys

import torch

import strata
from gpt_model import GPT, batches, param_groups


def main(mode, nvme, ckpt, out):
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
