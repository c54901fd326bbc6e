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
compare variants by their means over --seed 0..4 and --lr-scale 1, 1.0001, 0.9999.
--data (default $STRATA_BENCH_DATA, as bench/state_dtype.sh) is any text corpus, e.g.
tinyshakespeare.txt; without one, or with a missing file, a generated text stands in, said in
the output.
"""
import argparse
import math
import os
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
    warmup = min(20, steps // 10)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="demo")
    ap.add_argument("--steps", type=int, default=0, help="0: the model's (300 demo, 200 12x768)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--data", default=os.environ.get("STRATA_BENCH_DATA", ""))
    ap.add_argument("--variants", default="fp32,int8,int8-sr,int8-kahan,sr,kahan,bnb")
    ap.add_argument("--seed", type=int, default=0,
                    help="the model's initial weights (seed) and the batches (seed + 1); "
                         "0 is the recorded runs'")
    ap.add_argument("--lr-scale", type=float, default=1.0,
                    help="multiplies the model's learning rate: 1.0001 and 0.9999 give runs as "
                         "good as the default, whose spread is this benchmark's noise "
                         "(docs/design.md, \"What one quality run can tell\")")
    args = ap.parse_args()
    cfg = MODELS[args.model]
    data, source = text_bytes(args.data)
    print(f"# model {args.model} ({cfg['layers']} x {cfg['dim']}), steps "
          f"{args.steps or cfg['steps']}, batch {args.batch} x {args.seq}, seed {args.seed}, "
          f"lr x {args.lr_scale:g}, "
          f"data: {source}, "
          f"torch {torch.__version__}")
    print(f"{'variant':<11} {'B/param':>7} {'last20':>8} {'vs_fp32':>8} {'seconds':>8}")
    base = None
    for name in args.variants.split(","):
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
