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
# STRATA_TEST_FAIL="RANK:STEP": that rank's block 1 raises in the first forward of that step
# (0-based); the rank drops the step and goes on with the next one.
fail_rank, fail_step = (int(v) for v in os.environ.get("STRATA_TEST_FAIL", "-1:-1").split(":"))


def fail(module, inputs):
    raise ValueError("injected failure")


losses, skipped = [], []
for step, mb in enumerate(batches(steps, micro)):
    hook = model.blocks[1].register_forward_pre_hook(fail) if (rank, step) == (
        fail_rank, fail_step) else None
    try:
        for x, y in mb:
            loss = model(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
            (loss / micro).backward()
            losses.append(loss.item())
        opt.step()
    except ValueError:
        hook.remove()
        losses.extend([None] * micro)
    skipped.extend(s["skipped"] for s in eng.step_stats())  # the steps committed by now
    opt.zero_grad()
strata.save_safetensors(model, out + ".safetensors")  # a collective: every rank gathers
skipped.extend(s["skipped"] for s in eng.step_stats())  # the last step, committed by the save
assert len(skipped) == steps, skipped
# The moments: each rank gathers the whole of every parameter's (a collective). Loading other
# moments writes each rank's shard of them: read back, every rank has them bit for bit.
state = opt.state_dict()["state"]
torch.save(state, out + ".moments")
changed = opt.state_dict()
for s in changed["state"].values():
    s["exp_avg"] = s["exp_avg"] * 0.5 + 1.0
    s["exp_avg_sq"] = s["exp_avg_sq"] * 2.0
opt.load_state_dict(changed)
back = opt.state_dict()["state"]
assert all(torch.equal(back[i][k], changed["state"][i][k]) and
           float(back[i]["step"]) == float(changed["state"][i]["step"])
           for i in back for k in ("exp_avg", "exp_avg_sq")), "moments read back differ"

with open(out, "w") as f:
    json.dump({"rank": rank, "world": world, "losses": losses, "skipped": skipped,
               "norm": eng.last_step_stats()["grad_norm"]}, f)
