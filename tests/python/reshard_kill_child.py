"""A run for test_checkpoint_reshard_kill.py, in its own process, which the test kills: `NVME
CKPT` trains a step (a commit of this run's own), prints "loading", loads the multi-rank
checkpoint CKPT on this one rank (re-sharded from the ranks' files), trains a step (the first
commit of the loaded state) and prints "done"."""
import sys

import strata
from checkpoint_run import offloaded_run, train


def main(nvme, ckpt):
    model, opt = offloaded_run(nvme, "1M", "2M")
    train(model, opt, 1, seed=3)
    print("loading", flush=True)
    strata.load_checkpoint(model, ckpt)
    train(model, opt, 1, seed=2)
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
