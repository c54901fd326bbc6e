"""A run for test_checkpoint.py, in its own process: `save NVME CKPT OUT` trains 3 steps, saves
a checkpoint, trains 2 more and writes the weights to OUT; `load NVME CKPT OUT` builds the model
anew, loads the checkpoint and trains the same 2 steps."""
import sys

import torch

import strata
from gpt_model import GPT, batches, param_groups


def main(mode, nvme, ckpt, out):
    model = GPT(dropout=0.1)
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2,
                           engine=strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme]))
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    steps = list(batches(5, 2))
    if mode == "load":
        got = strata.load_checkpoint(model, ckpt, lr_scheduler=sched)
        assert got == {"epoch": 7}, got
        assert model.parameters().__next__()._strata_offload.engine.resumed_step == 3
        steps = steps[3:]
    for i, micro in enumerate(steps):
        if mode == "save" and i == 3:
            strata.save_checkpoint(model, ckpt, lr_scheduler=sched, client_state={"epoch": 7})
        for x, y in micro:
            (model(x, y) / 2).backward()
        opt.step()
        sched.step()
    strata.save_safetensors(model, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
