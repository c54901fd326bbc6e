"""One rank of test_checkpoint_ranks.py (launcher variables set by the test; none for one rank),
each rank on its rows of every batch: `run NVME CKPT OUT` trains 5 steps; `save NVME CKPT OUT`
trains 3 and saves the checkpoint CKPT; `load NVME CKPT OUT` loads CKPT (saved on any number of
ranks) and trains steps 4 and 5; `load-one NVME CKPT OUT` loads it and trains step 4 only;
`resume NVME - OUT` resumes the store in NVME (Engine(resume=True)) and trains steps 5 and 6;
`run6 NVME CKPT OUT` trains 6 steps. Each rank
writes OUT<rank>.json: the losses of its steps; the save and the load also the states after
step 3 (rank 0: OUT.safetensors, the weights as save_safetensors writes them; OUT.moments,
optimizer.state_dict()'s "state")."""
import json
import os
import sys

import torch

import strata
from gpt_model import GPT, batches

BATCH = 12  # rows of every step: each rank count of the test divides it


def main(mode, nvme, ckpt, out):
    eng = strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme], resume=mode == "resume")
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(model.parameters(), lr=2e-2)
    rank, world = eng.rank, eng.world_size
    steps = list(batches(6, 1, batch=BATCH))[:6 if mode in ("resume", "run6") else 5]

    def states():
        strata.save_safetensors(model, out + ".safetensors")  # collectives, every rank
        moments = opt.state_dict()["state"]
        if rank == 0:
            torch.save(moments, out + ".moments")

    if mode == "load":
        strata.load_checkpoint(model, ckpt)
        states()
        steps = steps[3:]
    elif mode == "load-one":
        strata.load_checkpoint(model, ckpt)
        steps = steps[3:4]
    elif mode == "resume":
        assert eng.resumed_step == 4, f"resumed at step {eng.resumed_step}, not 4"
        steps = steps[4:]
    rows, losses = BATCH // world, []
    for i, micro in enumerate(steps):
        if mode == "save" and i == 3:
            strata.save_checkpoint(model, ckpt)
            states()
            break
        for x, y in micro:
            loss = model(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
            loss.backward()
            losses.append(loss.item())
        opt.step()
    with open(f"{out}{rank}.json", "w") as f:
        json.dump(losses, f)
    if mode == "load-one":
        eng.close()  # its last step committed: the store a resume continues


if __name__ == "__main__":
    main(*sys.argv[1:])
