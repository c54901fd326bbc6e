#!/usr/bin/env python3
"""The cost of training through strata.offload, per step, against the same model trained by
plain torch doing the same work: a GPT-2 nn.Module (examples/train_gpt.py's), per-block
recompute (torch.utils.checkpoint) and the same AdamW kernel (strata.optim.AdamW on plain
parameters) with the same clipping.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_step.py --runs 3

Both sides run the same torch forward, recompute and backward; what the offloaded side adds is
the Python layer (hooks, views, gradient copies) and the engine on the host device (each
block's parameters copied to the "device" per acquire, the gradients copied back and
accumulated, the commit). Its engine is unlimited (no NVMe), so this measures overhead, not
I/O. Per run each side takes --warmup unmeasured steps and --steps measured ones (median);
printed: every run, the medians and overhead = (offloaded - plain) / offloaded, paired per run.
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils.checkpoint import checkpoint

import strata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_gpt import GPT  # noqa: E402


def groups(model):
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


class Recomputed(torch.nn.Module):
    """The plain side: each block under torch.utils.checkpoint, as offload recomputes it."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        for b in model.blocks:
            b.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=True))(b.forward)

    def forward(self, x, y):
        return self.model(x, y)


def step_times(model, opt, data, warmup, steps):
    times = []
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        t0 = time.perf_counter()
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(4):
        t = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        data.append((t[:, :-1], t[:, 1:]))
    geo = (args.vocab, args.seq, args.dim, args.heads, args.layers)
    n = sum(p.numel() for p in GPT(*geo).parameters())
    print(f"# GPT {n / 1e6:.1f}M params (vocab {args.vocab}, seq {args.seq}, dim {args.dim}, "
          f"{args.layers} layers), batch {args.batch}, torch threads {torch.get_num_threads()}; "
          "seconds per step:")
    res = {"offloaded": [], "plain": []}
    for r in range(args.runs):
        for side in (("offloaded", "plain") if r % 2 == 0 else ("plain", "offloaded")):
            torch.manual_seed(0)
            model = GPT(*geo)
            if side == "offloaded":
                eng = strata.Engine(device="cpu")
                model = strata.offload(model, blocks=list(model.blocks), engine=eng)
                opt = strata.optim.AdamW(groups(model), lr=1e-4, max_grad_norm=1.0)
            else:
                eng = None
                opt = strata.optim.AdamW(groups(model), lr=1e-4, max_grad_norm=1.0)
                model = Recomputed(model)
            res[side].append(step_times(model, opt, data, args.warmup, args.steps))
            if eng is not None:
                eng.close()
            del model, opt, eng
        print(f"run {r + 1}: offloaded {res['offloaded'][-1]:.3f}  plain {res['plain'][-1]:.3f}",
              flush=True)
    off, plain = statistics.median(res["offloaded"]), statistics.median(res["plain"])
    paired = statistics.median((a - b) / a for a, b in zip(res["offloaded"], res["plain"]))
    print(f"median: offloaded {off:.3f} s  plain {plain:.3f} s  overhead of medians "
          f"{(off - plain) / off * 100:.1f}%  paired {paired * 100:.1f}%")


if __name__ == "__main__":
    main()
