#!/usr/bin/env python3
"""Train a Hugging Face GPT2LMHeadModel (randomly initialised from a GPT2Config) with Strata
holding its parameters and AdamW states in pinned host memory and on NVMe, under hard budgets.

    PYTHONPATH=build/release/python:$HOME/.cache/strata/pydeps /usr/bin/python3 \\
        examples/train_hf_gpt2.py --data README.md --host-mem 2M --nvme /var/tmp/hf-run \\
        --out /var/tmp/hf-gpt2

The model is transformers' own, called as usual (model(input_ids=..., labels=...).loss); the
Strata parts are marked "Strata:". Nothing is downloaded: the bytes of the text file are the
tokens (vocabulary 256). Without --nvme every state stays in host memory; with it, give a new
folder per run (examples/train_gpt.py shows --resume, continuing one). --out writes a folder
that transformers loads back with GPT2LMHeadModel.from_pretrained (config.json and
model.safetensors). Needs transformers (tools/bootstrap.sh installs one that works with
Debian's torch 1.13 into ~/.cache/strata/pydeps: add that folder to PYTHONPATH).
"""
import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import strata


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="README.md", help="a text file (its bytes are tokens)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dropout", type=float, default=0.0, help="GPT2Config's *_pdrop (0.1 is "
                    "its default; 0 trains a small model on little data faster)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--device-mem", default=None, help="engine's device budget, e.g. 512K")
    ap.add_argument("--host-mem", default=None, help="pinned host budget, e.g. 2M")
    ap.add_argument("--nvme", action="append", default=[],
                    help="an empty folder on NVMe (repeatable)")
    ap.add_argument("--out", default=None, help="write config.json + model.safetensors here")
    args = ap.parse_args()

    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
    if len(data) <= args.seq + 1:
        raise SystemExit(f"{args.data}: needs more than {args.seq + 1} bytes")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=args.dim,
                        n_layer=args.layers, n_head=args.heads, resid_pdrop=args.dropout,
                        embd_pdrop=args.dropout, attn_pdrop=args.dropout)
    model = GPT2LMHeadModel(config)  # random init, training mode

    # Strata: the budgets, then every parameter moves into the engine. `blocks` are the
    # repeated layers in forward order (GPT2Block); the embeddings, the final norm and the
    # head tied to the token embedding come along as the rest.
    for folder in args.nvme:
        os.makedirs(folder, exist_ok=True)
    engine = strata.Engine(device=args.device, device_mem=args.device_mem,
                           host_mem=args.host_mem, nvme=args.nvme)
    model = strata.offload(model, blocks=list(model.transformer.h), engine=engine,
                           micro_batches=args.micro_batches)

    # Strata: a torch.optim.Optimizer; the engine runs its AdamW overlapped with backward.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = strata.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))  # warmup
    print(engine.placement())

    g = torch.Generator().manual_seed(1234)
    rows = args.batch // args.micro_batches
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        loss_sum = 0.0
        for _ in range(args.micro_batches):
            starts = torch.randint(0, len(data) - args.seq, (rows,), generator=g).tolist()
            x = torch.stack([data[s:s + args.seq] for s in starts])
            loss = model(input_ids=x, labels=x).loss  # labels shifted inside; blocks acquired
            (loss / args.micro_batches).backward()     # one at a time; gradients to the engine
            loss_sum += loss.item()
        opt.step()        # the norm is known; the updates run under the next forward
        opt.zero_grad()
        sched.step()
        # The engine's figures of each step as it commits: the step before, its updates done.
        done = "".join(f"  [step {s['step']}: eff {s['efficiency']:.2f} ({s['bound']}), nvme "
                       f"read {s['bytes']['nvme_read'] / 2**20:.2f} MiB]"
                       for s in engine.step_stats())
        print(f"step {step:4d}  loss {loss_sum / args.micro_batches:.4f}  "
              f"{time.perf_counter() - t0:.3f} s{done}", flush=True)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        model.config.save_pretrained(args.out)
        # Strata: gathers the weights from the engine (the tied head is written once).
        strata.save_safetensors(model, os.path.join(args.out, "model.safetensors"))
        # An ordinary transformers model again, e.g. to evaluate (on the file's start).
        trained = GPT2LMHeadModel.from_pretrained(args.out)  # eval mode: no dropout
        x = data[:len(data) // args.seq * args.seq].view(-1, args.seq)[:16]
        with torch.no_grad():
            loss = trained(input_ids=x, labels=x).loss.item()
        print(f"saved {args.out}; GPT2LMHeadModel.from_pretrained loads it: eval loss {loss:.4f}")


if __name__ == "__main__":
    main()
