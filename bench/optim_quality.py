"""How close compact optimizer states train to fp32 states, through strata.optim.AdamW on plain
CPU tensors (issue 42): the demo model (4 x 128, 300 steps) or 12 x 768 (200 steps) on a byte-
level text, the same batches for every variant, mean loss of the last 20 steps.

Variants (--variants, comma list):
  fp32        fp32 master and moments (strata's fused kernel)
  int8        int8 moments, fp32 master
  int8-sr     int8 moments, bf16 master with stochastic rounding
  int8-kahan  int8 moments, bf16 master + bf16 Kahan term
  sr, kahan   the bf16 masters with fp32 moments
  bnb         bitsandbytes' AdamW8bit (block-wise 8-bit moments, fp32 master)
B/param is the state each step reads and writes per parameter (scales not counted).

  python bench/optim_quality.py --model demo --data CORPUS.txt
One run's loss is chaotic: the learning rate times 1.0001 moves it by up to 3 % (fp32 too), so
compare variants by their means over many runs, a sweep of seeds and learning-rate scales:
  python bench/optim_quality.py --model demo --data CORPUS.txt --variants fp32,int8,bnb \
      --seeds 0-19 --lr-scales 1,1.0001,0.9999 --jobs 2 --json sweep.json
prints each run, then per variant its mean and the paired differences against fp32 and bnb.
--data (default $STRATA_BENCH_DATA, as bench/state_dtype.sh) is any text corpus, e.g.
tinyshakespeare.txt; without one, or with a missing file, a generated text stands in, said in
the output.
"""
import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
from gpt_model import GPT  # noqa: E402

import strata  # noqa: E402
import strata.optim  # noqa: E402

STATE_BYTES = {"fp32": 12, "int8": 6, "int8-sr": 4, "int8-kahan": 6, "sr": 10, "kahan": 12,
               "bnb": 6}
MODELS = {"demo": dict(layers=4, dim=128, heads=2, steps=300, lr=3e-3),
          "12x768": dict(layers=12, dim=768, heads=12, steps=200, lr=6e-4)}


def text_bytes(path):
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return torch.tensor(list(f.read()), dtype=torch.long), path
    g = torch.Generator().manual_seed(0)
    words = [bytes(w, "ascii") for w in
             "the of and to in a is that for it as was with be by on not he this are or his "
             "from at which but have an they you were her she there one all we their".split()]
    idx = torch.randint(len(words), (200000,), generator=g).tolist()
    data = b" ".join(words[i] for i in idx)
    return torch.tensor(list(data), dtype=torch.long), "generated (no --data file)"


def optimizer(name, params, lr, threads):
    if name == "bnb":
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.1)
    state = "int8" if name.startswith("int8") else "fp32"
    master = {"sr": "stochastic", "kahan": "kahan"}.get(name.split("-")[-1])
    return strata.optim.AdamW(params, lr=lr, weight_decay=0.1, rounding="fused",
                              state_dtype=state, master_dtype="bf16" if master else "fp32",
                              master_rounding=master or "stochastic", threads=threads)


def run(name, cfg, data, args):
    model = GPT(vocab=256, seq=args.seq, dim=cfg["dim"], heads=cfg["heads"],
                layers=cfg["layers"], seed=args.seed)
    opt = optimizer(name, model.parameters(), cfg["lr"] * args.lr_scale, args.threads)
    steps = args.steps or cfg["steps"]
    warmup = max(1, min(20, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(s, steps) / steps)))
    g = torch.Generator().manual_seed(1 + args.seed)
    losses = []
    t0 = time.time()
    for _ in range(steps):
        start = torch.randint(len(data) - args.seq - 1, (args.batch,), generator=g)
        x = torch.stack([data[s:s + args.seq] for s in start])
        y = torch.stack([data[s + 1:s + args.seq + 1] for s in start])
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    tail = losses[-20:]
    return sum(tail) / len(tail), time.time() - t0


def parse_list(text, kind):
    """"0-4" or "0,2,5" (ints), "1,1.0001" (floats)."""
    out = []
    for part in text.split(","):
        if kind is int and "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            out.extend(range(lo, hi + 1))
        else:
            out.append(kind(part))
    return out


_DATA = {}


def run_one(job):
    """One run of a sweep, in a worker process: one thread, as every run of a sweep."""
    name, seed, lr_scale, model, argv = job
    torch.set_num_threads(1)
    args = argparse.Namespace(**argv, seed=seed, lr_scale=lr_scale, threads=1)
    if args.data not in _DATA:
        _DATA[args.data] = text_bytes(args.data)[0]
    try:
        loss, secs = run(name, MODELS[model], _DATA[args.data], args)
    except ImportError as e:
        return job, None, str(e)
    return job, loss, secs


def paired(results, a, b):
    """Mean and standard error of loss(a) - loss(b) over the runs both have."""
    d = [results[a][k] - results[b][k] for k in results[a] if k in results.get(b, {})]
    if len(d) < 2:
        return None
    mean = statistics.fmean(d)
    return mean, statistics.stdev(d) / math.sqrt(len(d)), len(d)


def sweep(args, variants, seeds, scales):
    """Every variant at every seed and learning-rate scale, --jobs runs at a time; prints the
    runs in order as they end, then per variant the mean, its standard error, and the paired
    differences against fp32 and bitsandbytes (same seed and scale: the runs share weights and
    batches)."""
    argv = dict(steps=args.steps, batch=args.batch, seq=args.seq, data=args.data)
    jobs = [(v, s, f, args.model, argv) for s in seeds for f in scales for v in variants]
    results, skipped = {}, {}
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        for n, ((name, seed, scale, _, _), loss, extra) in enumerate(
                pool.map(run_one, jobs), 1):
            if loss is None:
                skipped[name] = extra
                continue
            results.setdefault(name, {})[(seed, scale)] = loss
            print(f"[{n}/{len(jobs)}] {name:<11} seed {seed} lr x {scale:g} last20 {loss:.4f} "
                  f"({extra:.1f} s)", flush=True)
    print(f"{'variant':<11} {'B/param':>7} {'runs':>4} {'mean':>7} {'se':>6} "
          f"{'vs_fp32':>16} {'vs_bnb':>16}")
    rows = []
    for name in variants:
        if name in skipped:
            print(f"{name:<11} skipped: {skipped[name]}")
            continue
        losses = list(results[name].values())
        row = dict(variant=name, bytes_per_param=2 * STATE_BYTES[name], runs=len(losses),
                   mean=statistics.fmean(losses),
                   se=statistics.stdev(losses) / math.sqrt(len(losses)) if len(losses) > 1
                   else None)
        cols = []
        for ref in ("fp32", "bnb"):
            p = paired(results, name, ref) if name != ref else None
            if p:
                row[f"vs_{ref}"] = dict(diff=p[0], se=p[1], runs=p[2],
                                        rel=statistics.fmean(results[name].values()) /
                                        statistics.fmean(results[ref].values()) - 1)
                cols.append(f"{p[0]:+.4f}±{p[1]:.4f}")
            else:
                cols.append("")
        se = f"{row['se']:6.4f}" if row["se"] is not None else f"{'':>6}"
        print(f"{name:<11} {row['bytes_per_param']:>7} {row['runs']:>4} {row['mean']:7.4f} "
              f"{se} {cols[0]:>16} {cols[1]:>16}")
        rows.append(row)
    print("vs_*: the mean paired difference of last20 (this variant - the other) ± its standard "
          "error")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="demo")
    ap.add_argument("--steps", type=int, default=0, help="0: the model's (300 demo, 200 12x768)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0,
                    help="strata's optimizer threads (0: all cores); a sweep runs on one")
    ap.add_argument("--data", default=os.environ.get("STRATA_BENCH_DATA", ""))
    ap.add_argument("--variants", default="fp32,int8,int8-sr,int8-kahan,sr,kahan,bnb")
    ap.add_argument("--seed", type=int, default=0,
                    help="the model's initial weights (seed) and the batches (seed + 1); "
                         "0 is the recorded runs'")
    ap.add_argument("--lr-scale", type=float, default=1.0,
                    help="multiplies the model's learning rate: 1.0001 and 0.9999 give runs as "
                         "good as the default, whose spread is this benchmark's noise "
                         "(docs/design.md, \"What one quality run can tell\")")
    ap.add_argument("--seeds", default="",
                    help="a sweep: these seeds (\"0-4\", \"0,3\") instead of --seed, each "
                         "run on one thread; prints the means and the paired differences")
    ap.add_argument("--lr-scales", default="",
                    help="a sweep: these learning-rate scales (\"1,1.0001,0.9999\") instead "
                         "of --lr-scale")
    ap.add_argument("--jobs", type=int, default=1,
                    help="a sweep's runs at a time, one process each (e.g. the core count)")
    ap.add_argument("--json", default="", help="a sweep's summary as JSON to this file")
    args = ap.parse_args()
    cfg = MODELS[args.model]
    variants = args.variants.split(",")
    for name in variants:
        if name not in STATE_BYTES:
            ap.error(f"--variants: unknown variant {name!r} (known: {', '.join(STATE_BYTES)})")
    data, source = text_bytes(args.data)
    try:
        seeds = parse_list(args.seeds, int) if args.seeds else [args.seed]
        scales = parse_list(args.lr_scales, float) if args.lr_scales else [args.lr_scale]
    except ValueError as e:
        ap.error(f"--seeds / --lr-scales: {e} (e.g. --seeds 0-19 --lr-scales 1,1.0001,0.9999)")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: give at least 1")
    print(f"# model {args.model} ({cfg['layers']} x {cfg['dim']}), steps "
          f"{args.steps or cfg['steps']}, batch {args.batch} x {args.seq}, "
          f"seed {','.join(map(str, seeds))}, lr x {','.join(f'{f:g}' for f in scales)}, "
          f"data: {source}, "
          f"torch {torch.__version__}", flush=True)
    if len(seeds) * len(scales) > 1:
        rows = sweep(args, variants, seeds, scales)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(model=args.model, seeds=seeds, lr_scales=scales, data=source,
                               variants=rows), f, indent=1)
        return
    print(f"{'variant':<11} {'B/param':>7} {'last20':>8} {'vs_fp32':>8} {'seconds':>8}")
    base = None
    for name in variants:
        try:
            loss, secs = run(name, cfg, data, args)
        except ImportError as e:
            print(f"{name:<11} skipped: {e}")
            continue
        base = loss if name == "fp32" else base
        rel = f"{loss / base - 1:+8.2%}" if base else f"{'':>8}"
        print(f"{name:<11} {2 * STATE_BYTES[name]:>7} {loss:8.4f} {rel} {secs:8.1f}", flush=True)


if __name__ == "__main__":
    main()
