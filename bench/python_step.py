#!/usr/bin/env python3
"""The cost of training through strata.offload, per step, against the same model trained by
plain torch doing the same work: a GPT-2 nn.Module (examples/train_gpt.py's), per-block
recompute (torch.utils.checkpoint) and the same AdamW kernel (strata.optim.AdamW on plain
parameters) with the same clipping.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_step.py --steps 9

Both sides run the same torch forward, recompute and backward; what the offloaded side adds is
the Python layer (hooks, views, gradient copies) and the engine on the host device (each
block's parameters copied to the "device" per acquire, the gradients copied back and
accumulated, the commit). Its engine is unlimited (no NVMe), so this measures overhead, not
I/O. Both models live at once and their steps alternate (--warmup unmeasured pairs, then
--steps measured ones), so each pair sees the same load; printed: every pair, the medians, and
overhead = (offloaded - plain) / offloaded, of the medians and paired (median per pair).
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


def one_step(model, opt, batch):
    x, y = batch
    t0 = time.perf_counter()
    model(x, y).backward()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=9, help="measured pairs of steps")
    ap.add_argument("--warmup", type=int, default=2)
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
    # Both sides live at once and their steps alternate (flipping which goes first), so each
    # pair of steps sees the same load from the machine's other tenants.
    torch.manual_seed(0)
    off_model = GPT(*geo)
    eng = strata.Engine(device="cpu")
    off_model = strata.offload(off_model, blocks=list(off_model.blocks), engine=eng)
    off_opt = strata.optim.AdamW(groups(off_model), lr=1e-4, max_grad_norm=1.0)
    torch.manual_seed(0)
    plain_model = GPT(*geo)
    plain_opt = strata.optim.AdamW(groups(plain_model), lr=1e-4, max_grad_norm=1.0)
    plain_model = Recomputed(plain_model)
    sides = {"offloaded": (off_model, off_opt), "plain": (plain_model, plain_opt)}
    res = {"offloaded": [], "plain": []}
    for i in range(args.warmup + args.steps):
        order = ("offloaded", "plain") if i % 2 == 0 else ("plain", "offloaded")
        times = {k: one_step(*sides[k], data[i % len(data)]) for k in order}
        if i >= args.warmup:
            for k in res:
                res[k].append(times[k])
            print(f"step {i - args.warmup + 1}: offloaded {times['offloaded']:.3f}  plain "
                  f"{times['plain']:.3f}", flush=True)
    eng.close()
    off, plain = statistics.median(res["offloaded"]), statistics.median(res["plain"])
    paired = statistics.median((a - b) / a for a, b in zip(res["offloaded"], res["plain"]))
    print(f"median: offloaded {off:.3f} s  plain {plain:.3f} s  overhead of medians "
          f"{(off - plain) / off * 100:.1f}%  paired (median of per-pair) {paired * 100:.1f}%")


if __name__ == "__main__":
    main()
