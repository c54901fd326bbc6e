"""One rank of test_checkpoint_collectives.py's two-rank run (launcher variables set by the
test): `NVME OUT` trains a step, then optimizer.state_dict() with rank 1's reads of the engine's
moments failing (injected here, as an I/O error of its store would), and writes the error's
message to OUT. A rank then waits (a minute at most) until both have written theirs, as a
training script that goes on would: a rank that left its gathers early would otherwise be found
out only by the other's gather failing when its process exits."""
import os
import sys
import time

import strata
from gpt_model import GPT, batches, param_groups


class _FailingReads:
    """The engine's core, whose read_component fails (every other call goes to the core)."""

    def __init__(self, core):
        self._core = core

    def read_component(self, *args):
        raise strata.Error("injected: rank 1 cannot read its moments")

    def __getattr__(self, name):
        return getattr(self._core, name)


def main(nvme, out):
    eng = strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme])
    rank = int(os.environ["RANK"])
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2, engine=eng)
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2)
    for x, y in next(batches(1, 2)):
        (model(x[rank * 2:rank * 2 + 2], y[rank * 2:rank * 2 + 2]) / 2).backward()
    opt.step()
    if rank == 1:
        state = next(model.parameters())._strata_offload
        failing = _FailingReads(state.core())
        state.core = lambda: failing
    try:
        opt.state_dict()
        message = "optimizer.state_dict() did not fail"
    except strata.Error as e:
        message = f"{type(e).__name__}: {e}"
    with open(f"{out}.partial", "w") as f:
        f.write(message)
    os.rename(f"{out}.partial", out)
    others = [out.replace(f"rank{rank}", f"rank{r}") for r in range(2)]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(o) for o in others) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main(*sys.argv[1:])
