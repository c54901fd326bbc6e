"""One rank of test_multirank.py: trains the test GPT on this rank's rows of each batch and
prints the losses as JSON. Without launcher variables it is the single-rank reference."""
import json
import os
import sys

import torch

import strata
from gpt_model import GPT, batches, param_groups

steps, micro, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
nvme = sys.argv[4:]
eng = strata.Engine(device="cpu", host_mem="600K" if nvme else None, nvme=nvme)
model = GPT(seed=int(os.environ.get("RANK", "0")))  # rank 0's weights reach every rank
model = strata.offload(model, blocks=list(model.blocks), engine=eng, micro_batches=micro)
opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, betas=(0.9, 0.95),
                         max_grad_norm=1.0)
rank, world = eng.rank, eng.world_size
rows = 4 // world
losses = []
for mb in batches(steps, micro):
    for x, y in mb:
        loss = model(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
        (loss / micro).backward()
        losses.append(loss.item())
    opt.step()
    opt.zero_grad()
strata.save_safetensors(model, out + ".safetensors")  # a collective: every rank gathers
with open(out, "w") as f:
    json.dump({"rank": rank, "world": world, "losses": losses,
               "norm": eng.last_step_stats()["grad_norm"]}, f)
