#!/usr/bin/env python3
"""Train a small GPT-2 (an ordinary PyTorch nn.Module) with Strata holding its parameters and
AdamW states in pinned host memory and on NVMe, under hard budgets.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/train_gpt.py \
        --data README.md --steps 50 --host-mem 8M --nvme /var/tmp/gpt-run

The model code is plain torch; the Strata parts are marked "Strata:". Without --nvme every
state stays in host memory. Characters of the text file are the tokens (vocabulary 256).
"""
import argparse
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import strata


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.attn_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, dim, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the head is tied to the embedding
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="README.md", help="a text file (its bytes are tokens)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--device-mem", default=None, help="engine's device budget, e.g. 4M")
    ap.add_argument("--host-mem", default=None, help="pinned host budget, e.g. 8M")
    ap.add_argument("--nvme", action="append", default=[], help="a folder on NVMe (repeatable)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --nvme")
    ap.add_argument("--save", default=None, help="write the trained weights (safetensors)")
    ap.add_argument("--losses", default=None, help="append 'step loss' lines (full precision)")
    args = ap.parse_args()

    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
    if len(data) <= args.seq + 1:
        raise SystemExit(f"{args.data}: needs more than {args.seq + 1} bytes")
    torch.manual_seed(0)
    model = GPT(256, args.seq, args.dim, heads=4, layers=args.layers)

    # Strata: the budgets, then every parameter moves into the engine. `blocks` are the
    # repeated layers in forward order; embeddings, final norm and tied head come along.
    for folder in args.nvme:
        os.makedirs(folder, exist_ok=True)
    engine = strata.Engine(device=args.device, device_mem=args.device_mem,
                           host_mem=args.host_mem, nvme=args.nvme, resume=args.resume)
    model = strata.offload(model, blocks=list(model.blocks), engine=engine,
                           micro_batches=args.micro_batches)

    # Strata: a torch.optim.Optimizer; the engine runs its AdamW overlapped with backward.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = strata.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8, max_grad_norm=1.0)
    first = engine.resumed_step  # 0, or the step a resumed run committed last
    warmup = 10
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (first + s + 1) / warmup))
    print(engine.placement())
    if first:
        print(f"resuming after step {first}, the last one committed", flush=True)

    g = torch.Generator().manual_seed(1234)
    rows = args.batch // args.micro_batches
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(data) - args.seq - 1, (args.micro_batches, rows),
                               generator=g)
        if step <= first:
            continue  # a resumed run skips the batches already trained on
        t0 = time.perf_counter()
        loss_sum = 0.0
        for mb in starts:
            rows_ = torch.stack([data[s:s + args.seq + 1] for s in mb.tolist()])
            loss = model(rows_[:, :-1], rows_[:, 1:])  # blocks acquired one at a time
            (loss / args.micro_batches).backward()     # gradients go to the engine
            loss_sum += loss.item()
        opt.step()        # the norm is known; the updates run under the next forward
        opt.zero_grad()
        sched.step()
        if args.losses:
            with open(args.losses, "a") as f:
                f.write(f"{step} {loss_sum / args.micro_batches!r}\n")
        # The engine's figures of each step as it commits: the step before, its updates done.
        done = "".join(f"  [step {s['step']}: eff {s['efficiency']:.2f} ({s['bound']}), nvme "
                       f"read {s['bytes']['nvme_read'] / 2**20:.1f} MiB]"
                       for s in engine.step_stats())
        print(f"step {step:4d}  loss {loss_sum / args.micro_batches:.4f}  "
              f"{time.perf_counter() - t0:.3f} s{done}", flush=True)
    if args.save:
        strata.save_safetensors(model, args.save)  # gathers the weights from the engine
        print(f"saved {args.save}")


if __name__ == "__main__":
    main()
