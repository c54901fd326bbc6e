#!/usr/bin/env python3
"""Seconds per training step of a Hugging Face GPT2LMHeadModel (issue 27's model: n_layer=6,
n_embd=384, n_head=6, n_positions=128, vocab 256, use_cache=False; seq 128, batch 4, AdamW,
clip 1.0) trained by plain torch (torch.optim.AdamW after clip_grad_norm_) and through
strata.offload with recompute=True and recompute=False (an unlimited CPU engine, no NVMe).

All models live at once and their steps alternate (--warmup unmeasured rounds, then --steps
measured ones), so each round sees the same load; printed: each side's median s/step and its
ratio to plain torch's.

    OMP_NUM_THREADS=2 PYTHONPATH=build/release/python /usr/bin/python3 bench/hf_gpt2_step.py
"""
import argparse
import os
import statistics
import sys
import time

import torch

import strata

_PYDEPS = os.path.join(os.path.expanduser("~/.cache"), "strata", "pydeps")
if os.path.isdir(_PYDEPS) and _PYDEPS not in sys.path:
    sys.path.append(_PYDEPS)
import transformers  # noqa: E402

CLIP, LR = 1.0, 1e-4


def make(args):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.seq,
                                     n_embd=args.dim, n_layer=args.layers, n_head=args.heads,
                                     use_cache=False)
    return transformers.GPT2LMHeadModel(config)


def plain_side(args):
    model = make(args)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(x):
        model(input_ids=x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return step


def strata_side(args, recompute):
    model = make(args)
    model = strata.offload(model, blocks=list(model.transformer.h),
                           engine=strata.Engine(device="cpu"), recompute=recompute)
    opt = strata.optim.AdamW(model.parameters(), lr=LR, max_grad_norm=CLIP)

    def step(x):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=9, help="measured rounds")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    sides = {"torch": plain_side(args), "strata recompute=True": strata_side(args, True),
             "strata recompute=False": strata_side(args, False)}
    g = torch.Generator().manual_seed(1)
    times = {name: [] for name in sides}
    for r in range(args.warmup + args.steps):
        x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            t0 = time.perf_counter()
            sides[name](x)
            if r >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["torch"])
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, {args.steps} rounds")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:24s} median {m:.3f} s/step  x{m / base:.3f} of torch  "
              f"(min {min(ts):.3f}, max {max(ts):.3f})")


if __name__ == "__main__":
    main()
