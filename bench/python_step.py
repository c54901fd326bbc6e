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

With --against-train BIN (the issue's comparison), the offloaded step is set against `BIN train`
(strata train: the same geometry, recompute, host device, no NVMe) instead: --rounds rounds,
each one `strata train` run of --steps steps (a subprocess, its per-step seconds from --json;
its first step is warm-up and not counted) and --steps offloaded steps in this process, the
order flipping every round. The offloaded engine runs with timing=True, so each step also
splits into the layer's own Python work, its copies between torch and the engine, engine calls,
the blocks' torch compute and the rest (the model's non-block compute: embeddings, head, loss).
The two sides compute differently (torch's CPU ops against Strata's own GEMMs), so the ratio of
step times is not the layer's overhead; the layer's share is measured directly: own / step
(and (own + copy) / step, counting the copies the layer adds), and each side's non-compute
time is set against the other's (see against_train).

    OMP_NUM_THREADS=1 PYTHONPATH=build/release/python /usr/bin/python3 bench/python_step.py \
        --against-train build/release/tools/strata --rounds 3 --steps 6

With --tail (the pipelined step boundary, issue 23), two offloaded models train side by side,
one with the default pipeline="on" and one with pipeline=False (the updates at the end of the
step), their steps alternating (flipping which goes first), both with max_grad_norm so every
update waits for the norm; optional --nvme DIR (with --device-mem/--host-mem) puts the states
on NVMe as the demo does. Per step and side, as `strata train` reports it: the step's seconds,
its tail (from the end of the last backward to the end of opt.step(), the serial part nothing
overlaps; `strata train`'s tail is from the compute lane's last operation, which on the host
device the Python path leaves empty) as a share of the step, its efficiency (the blocks' and
the model's torch compute over the step, as --against-train counts compute), and from the
engine's final statistics of the step (Engine.step_stats(), one step later when pipelined):
deferred_blocks, overlapped_seconds and its cpu_optim seconds. Medians at the end.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_step.py --tail --steps 9
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def one_step(model, opt, batch, split=None):
    """Seconds of one step; with `split` (a list), appends the seconds from the end of the
    backward to the end of opt.step() (the step's serial tail) to it."""
    x, y = batch
    t0 = time.perf_counter()
    model(x, y).backward()
    t1 = time.perf_counter()
    opt.step()
    t2 = time.perf_counter()
    opt.zero_grad()
    if split is not None:
        split.append(t2 - t1)
    return t2 - t0


def _batches(args):
    """The four (input, target) batches every run steps through (seed 0)."""
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(4):
        t = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        data.append((t[:, :-1], t[:, 1:]))
    return data


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
    ap.add_argument("--against-train", metavar="BIN", default=None,
                    help="the strata binary: compare with `BIN train` instead of plain torch")
    ap.add_argument("--rounds", type=int, default=3, help="with --against-train")
    ap.add_argument("--tail", action="store_true",
                    help="pipeline=\"on\" against pipeline=False: the serial tail per step")
    ap.add_argument("--nvme", default=None, help="with --tail: a folder for the states")
    ap.add_argument("--device-mem", default=None, help="with --tail: the engines' device budget")
    ap.add_argument("--host-mem", default=None, help="with --tail: the engines' host budget")
    args = ap.parse_args()
    if args.against_train:
        return against_train(args)
    if args.tail:
        return pipeline_tail(args)
    data = _batches(args)
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


def pipeline_tail(args):
    """pipeline="on" against pipeline=False, steps alternating; see the module docstring."""
    data = _batches(args)
    geo = (args.vocab, args.seq, args.dim, args.heads, args.layers)
    sides, engines, runs = {}, {}, {}
    for name, pipeline in (("pipelined", "on"), ("at_end", "off")):
        nvme = None
        if args.nvme:
            nvme = os.path.join(args.nvme, name)
            os.makedirs(nvme)
        engines[name] = strata.Engine(device="cpu", timing=True, pipeline=pipeline, nvme=nvme,
                                      device_mem=args.device_mem, host_mem=args.host_mem)
        torch.manual_seed(0)
        model = GPT(*geo)
        model = strata.offload(model, blocks=list(model.blocks), engine=engines[name])
        opt = strata.optim.AdamW(groups(model), lr=1e-4, max_grad_norm=1.0)
        sides[name] = (model, opt)
        runs[name] = {"step": [], "tail": [], "final": {}}
    n = sum(p.numel() for p in sides["pipelined"][0].parameters())
    print(f"# GPT {n / 1e6:.1f}M params (vocab {args.vocab}, seq {args.seq}, dim {args.dim}, "
          f"{args.layers} layers), batch {args.batch}, max_grad_norm 1.0, host device, "
          f"{'states on NVMe ' + args.nvme if args.nvme else 'no NVMe'} (device_mem "
          f"{args.device_mem or 'unlimited'}, host_mem {args.host_mem or 'unlimited'}); torch "
          f"threads {torch.get_num_threads()}; {args.warmup} pairs of steps unmeasured, then "
          f"{args.steps}")
    total = args.warmup + args.steps
    for i in range(total):
        order = ("pipelined", "at_end") if i % 2 == 0 else ("at_end", "pipelined")
        for name in order:
            r = runs[name]
            r["step"].append(one_step(*sides[name], data[i % len(data)], r["tail"]))
            for st in engines[name].step_stats():
                r["final"][st["step"]] = st
    for name in runs:
        engines[name].flush()
        for st in engines[name].step_stats():
            runs[name]["final"][st["step"]] = st
    cols = ("step_s", "tail_s", "tail_pct", "eff", "deferred", "overlapped_s", "optim_s")
    med = statistics.median
    summary = {}
    for name in runs:
        r = runs[name]
        rows = []
        for i in range(args.warmup, total):
            st = r["final"][i + 1]
            t = st["python"]
            sec = r["step"][i]
            # The model's compute: the blocks' torch compute and everything outside the layer.
            compute = t["compute"] + sec - t["layer"]
            rows.append(dict(step_s=sec, tail_s=r["tail"][i], tail_pct=100 * r["tail"][i] / sec,
                             eff=compute / sec, deferred=st["deferred_blocks"],
                             overlapped_s=st["overlapped_seconds"],
                             optim_s=st["busy_seconds"]["cpu_optim"]))
        print(f"# {name}: step " + "  ".join(f"{c:>12s}" for c in cols))
        for k, row in enumerate(rows):
            print(f"{name:>10s} {k + 1:4d} " + "  ".join(f"{row[c]:12.4f}" for c in cols))
        summary[name] = {c: med(row[c] for row in rows) for c in cols}
    print("# medians:")
    for name, m in summary.items():
        print(f"{name:>10s} " + "  ".join(f"{c} {m[c]:.4g}" for c in cols))
    p, e = summary["pipelined"], summary["at_end"]
    print(f"# pipelined / at_end step time {p['step_s'] / e['step_s']:.3f}; tail "
          f"{p['tail_pct']:.1f} % vs {e['tail_pct']:.1f} % of the step; efficiency "
          f"{p['eff']:.2f} vs {e['eff']:.2f}")
    for name in engines:
        engines[name].close()


def train_run(args):
    """One `strata train` run at the benchmark's geometry; its steps' --json records."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "train.json")
        cmd = [args.against_train, "train", "--layers", str(args.layers), "--d-model",
               str(args.dim), "--heads", str(args.heads), "--seq-len", str(args.seq), "--batch",
               str(args.batch), "--vocab", str(args.vocab), "--steps", str(args.steps + 1),
               "--recompute", "--device", "cpu", "--lr", "1e-4", "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["steps"]


def against_train(args):
    """Rounds of `strata train` against the offloaded Python step; see the module docstring.

    Per side, a step's seconds split into compute and the rest ("other"):
      strata train: compute = the compute lane's busy seconds (its model's kernels);
      Python: compute = the blocks' torch compute (forward, recompute, autograd.grad) plus
        everything outside the layer (the model's embeddings, head and loss, forward and
        backward, and autograd's own work), other = the layer's own Python + its copies +
        its engine calls.
    Printed per round (medians over its steps): both splits, the layer's own share of the
    Python step, own + copy, and extra = (other_python - other_train) / step_python, what the
    Python path adds beyond strata train's own non-compute time."""
    data = _batches(args)
    geo = (args.vocab, args.seq, args.dim, args.heads, args.layers)
    torch.manual_seed(0)
    model = GPT(*geo)
    n = sum(p.numel() for p in model.parameters())
    print(f"# GPT {n / 1e6:.1f}M params (vocab {args.vocab}, seq {args.seq}, dim {args.dim}, "
          f"{args.heads} heads, {args.layers} layers), batch {args.batch}, recompute, host "
          f"device, no NVMe; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"torch threads {torch.get_num_threads()}; {args.rounds} rounds of {args.steps} steps "
          f"per side (strata train runs {args.steps + 1}, its first not counted; "
          f"{args.warmup} Python steps before round 1 not counted); medians in seconds")
    eng = strata.Engine(device="cpu", timing=True)
    model = strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(groups(model), lr=1e-4, max_grad_norm=1.0)
    for i in range(args.warmup):
        one_step(model, opt, data[i % len(data)])
    cols = ("train_step", "train_compute", "train_other", "py_step", "py_compute", "py_own",
            "py_copy", "py_engine", "py_other", "own_pct", "own_copy_pct", "extra_pct")
    print("round  " + "  ".join(cols))
    rows = []
    for r in range(args.rounds):
        py = []

        def python_side():
            secs = [one_step(model, opt, data[i % len(data)]) for i in range(args.steps)]
            eng.flush()  # the last step commits (pipelined): every step's statistics are final
            for sec, st in zip(secs, eng.step_stats()[-args.steps:]):
                t = st["python"]
                py.append(dict(step=sec, compute=t["compute"] + sec - t["layer"], own=t["own"],
                               copy=t["copy"], engine=t["engine"],
                               other=t["own"] + t["copy"] + t["engine"],
                               calls=t["engine_calls"]))

        if r % 2 == 0:
            train = train_run(args)[1:]
            python_side()
        else:
            python_side()
            train = train_run(args)[1:]
        med = statistics.median
        row = dict(train_step=med(s["seconds"] for s in train),
                   train_compute=med(s["busy_seconds"]["compute"] for s in train),
                   train_other=med(s["seconds"] - s["busy_seconds"]["compute"] for s in train),
                   py_step=med(s["step"] for s in py), py_compute=med(s["compute"] for s in py),
                   py_own=med(s["own"] for s in py), py_copy=med(s["copy"] for s in py),
                   py_engine=med(s["engine"] for s in py), py_other=med(s["other"] for s in py),
                   own_pct=med(100 * s["own"] / s["step"] for s in py),
                   own_copy_pct=med(100 * (s["own"] + s["copy"]) / s["step"] for s in py))
        row["extra_pct"] = 100 * (row["py_other"] - row["train_other"]) / row["py_step"]
        rows.append(row)
        print(f"{r + 1:5d}  " + "  ".join(f"{row[c]:.4f}" if c == "py_own" else
                                           f"{row[c]:.1f}" if c.endswith("pct") else
                                           f"{row[c]:.3f}" for c in cols))
        names = sorted({k for s in py for k in s["calls"]})
        print("#   py_engine by call: " + "  ".join(
            f"{k} {med(s['calls'].get(k, 0.0) for s in py):.3f}" for k in names), flush=True)
    eng.close()
    m = {c: statistics.median(r[c] for r in rows) for c in cols}
    print("median " + "  ".join(f"{c} {m[c]:.4g}" for c in cols))
    print(f"# the layer's own Python: {m['own_pct']:.1f} % of the Python step; with its copies "
          f"{m['own_copy_pct']:.1f} %; Python step / strata train step "
          f"{m['py_step'] / m['train_step']:.2f} (compute {m['py_compute']:.3f} s vs "
          f"{m['train_compute']:.3f} s)")


if __name__ == "__main__":
    main()
