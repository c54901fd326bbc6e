#!/usr/bin/env python3
"""strata.optim.AdamW against torch.optim.AdamW on the same CPU parameters: Gparam/s and ratio.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/optim_adamw.py \
        --params 16M --tensors 16 --threads 1 --runs 5

Per run, each optimizer (in rotating order) takes --warmup unmeasured steps and then --steps
measured ones over its own copy of the same parameters and gradients (fp32, weight decay on,
no clipping); a run's figure is the median step. Printed: every run, then the median of the
runs per optimizer, the ratio strata / torch of those medians, and the paired ratio (the
median of the per-run ratios, which cancels most of a shared machine's drift). Gparam/s = parameters
updated per second / 1e9. torch's variants: the default for-loop and foreach (torch 1.13 has
no fused CPU AdamW). --threads sets both torch's intra-op threads and the kernel's OpenMP
threads. --rounding picks strata's form (torch: torch's rounding, the default; fused: the
engine's). #wrong counts elements of strata's parameters beyond 1e-6 relative of torch's
after each run (fused: with a floor of 1e-6 of the tensor's largest value, see
tests/python/test_optim.py).
"""
import argparse
import json
import statistics
import sys
import time

import torch

import strata
from strata._sizes import parse_bytes


def make(n, tensors, seed):
    g = torch.Generator().manual_seed(seed)
    sizes = [n // tensors] * tensors
    sizes[-1] += n - sum(sizes)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


def timed_steps(opt, warmup, steps):
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="16M", help="parameters in all (K/M/G: binary units)")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounding", choices=("torch", "fused"), default="torch")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    n = parse_bytes("--params", args.params)
    torch.set_num_threads(args.threads)
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    makers = {
        "strata": lambda ps: strata.optim.AdamW(ps, threads=args.threads,
                                                rounding=args.rounding, **kw),
        "torch": lambda ps: torch.optim.AdamW(ps, foreach=False, **kw),
        "torch_foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, **kw),
    }
    names = list(makers)
    print(f"# {n} params in {args.tensors} tensors, {args.threads} thread(s), torch "
          f"{torch.__version__}, strata {strata.__version__} (kernel "
          f"{strata._strata.cpu_isa()}, rounding {args.rounding}); Gparam/s per run:")
    runs = {k: [] for k in names}
    wrong = 0
    for r in range(args.runs):
        order = names[r % len(names):] + names[:r % len(names)]
        final = {}
        for name in order:
            params = make(n, args.tensors, seed=r)
            sec = timed_steps(makers[name](params), args.warmup, args.steps)
            runs[name].append(n / sec / 1e9)
            final[name] = params
        # The data check: after the same steps, strata's parameters agree with torch's within
        # 1e-6 relative, as tests/python/test_optim.py asserts.
        for a, b in zip(final["strata"], final["torch"]):
            a, b = a.detach(), b.detach()
            floor = b.abs().max() if args.rounding == "fused" else 0.0
            wrong += int(((a - b).abs() > 1e-6 * (b.abs() + floor)).sum())
        del final
        print("run %d: " % (r + 1) + "  ".join(f"{k} {runs[k][-1]:.3f}" for k in names) +
              f"  #wrong {wrong}", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print("median: " + "  ".join(f"{k} {med[k]:.3f}" for k in names))
    paired = {k: statistics.median(a / b for a, b in zip(runs["strata"], runs[k]))
              for k in ("torch", "torch_foreach")}
    print(f"ratio of medians strata/torch {med['strata'] / med['torch']:.2f}  "
          f"strata/torch_foreach {med['strata'] / med['torch_foreach']:.2f}; paired (median of "
          f"per-run ratios) {paired['torch']:.2f}  {paired['torch_foreach']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": n, "threads": args.threads, "runs": runs, "median": med,
                       "paired_ratio": paired, "wrong": wrong}, f)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
