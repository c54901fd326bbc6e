"""A GPT-2 trained three ways on one device: resident (torch.optim.AdamW, the model in device
memory), through strata.offload with unlimited budgets (in memory) and with a device budget
far under the model's states (offloaded). Prints one JSON object: each run's losses and
tokens/s, and the checks: offloaded == in memory bit for bit (same kernels, same order), and
each within `tolerance` of resident (torch's AdamW rounds otherwise).

    python bench/python_gpu.py --model hf --device cuda --json out.json   # GPT2LMHeadModel
    python bench/python_gpu.py --model gpt --device cpu --layers 2 --dim 64 --seq 32 --steps 3

--model hf needs transformers; --model gpt is tests/python/gpt_model.py's GPT at the same
geometry. tools/gpu_check_python.sh runs it on the lent GPU machine. Exit status 1 when a
check fails."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "tests", "python"))
for _deps in (os.environ.get("STRATA_PYDEPS"),
              os.path.expanduser("~/.cache/strata/pydeps")):
    if _deps and os.path.isdir(_deps) and _deps not in sys.path:
        sys.path.append(_deps)

import strata  # noqa: E402


class _HfLoss(torch.nn.Module):
    """GPT2LMHeadModel(ids, labels=ids).loss, as a module whose forward takes (x, y)."""

    def __init__(self, a):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.dim, n_layer=a.layers,
                         n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         use_cache=False)
        cfg._attn_implementation = "eager"  # deterministic backward: bit-for-bit comparable
        torch.manual_seed(0)
        self.lm = GPT2LMHeadModel(cfg)

    def blocks(self):
        return list(self.lm.transformer.h)

    def forward(self, x, y):
        return self.lm(input_ids=x, labels=y, use_cache=False).loss


class _Gpt(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        from gpt_model import GPT
        self.gpt = GPT(vocab=a.vocab, seq=a.seq, dim=a.dim, heads=a.heads, layers=a.layers)

    def blocks(self):
        return list(self.gpt.blocks)

    def forward(self, x, y):
        return self.gpt(x, y)


def _run(a, how, nvme):
    model = (_HfLoss(a) if a.model == "hf" else _Gpt(a)).to(a.device)
    kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    engine = None
    if how == "resident":
        opt = torch.optim.AdamW(model.parameters(), **kw)
    else:
        budget = dict(device_mem=a.device_mem, host_mem=a.host_mem, nvme=nvme) \
            if how == "offloaded" else {}
        engine = strata.Engine(device=a.device, **budget)
        strata.offload(model, blocks=model.blocks(), engine=engine)
        opt = strata.optim.AdamW(model.parameters(), max_grad_norm=a.clip, **kw)
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(a.device)
            for _ in range(a.steps)]
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    losses, seconds = [], []
    for ids in data:
        sync()
        t0 = time.perf_counter()
        loss = model(ids, ids)
        loss.backward()
        if engine is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad()
        sync()
        seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
    step_s = statistics.median(seconds[1:] or seconds)  # the first step sets up
    out = {"losses": losses, "median_step_s": step_s,
           "tokens_per_s": a.batch * a.seq / step_s}
    if engine is not None:
        engine.flush()  # the last step commits (its updates ran under no next step)
        s = engine.last_step_stats()
        out.update(dtype=engine._model._core.dtype, peak_device_bytes=s["peak_device_bytes"],
                   h2d_bytes=s["bytes"]["h2d"], efficiency=s["efficiency"])
        out["weights"] = engine._model.gather()
        engine.close()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("hf", "gpt"), default="hf")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--device-mem", default="512M", help="the offloaded run's device budget")
    p.add_argument("--host-mem", default="0", help="the offloaded run's host budget (0: all)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest relative loss difference from the resident run")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    host_mem = a.host_mem if a.host_mem != "0" else None
    a.host_mem = host_mem
    runs = {}
    with tempfile.TemporaryDirectory(prefix="strata-python-gpu-") as nvme:
        for how in ("resident", "in_memory", "offloaded"):
            runs[how] = _run(a, how, [nvme] if host_mem else None)
    w_off, w_mem = runs["offloaded"].pop("weights"), runs["in_memory"].pop("weights")
    ref = runs["resident"]["losses"]

    def worst(losses):
        return max(abs(x - r) / abs(r) for x, r in zip(losses, ref))
    checks = {
        "offloaded_equals_in_memory": runs["offloaded"]["losses"] == runs["in_memory"]["losses"]
        and all(torch.equal(w_off[n], w_mem[n]) for n in w_off),
        "worst_relative_loss_diff_vs_resident": {k: worst(runs[k]["losses"])
                                                 for k in ("in_memory", "offloaded")},
        "tolerance": a.tolerance,
    }
    checks["ok"] = checks["offloaded_equals_in_memory"] and all(
        v <= a.tolerance for v in checks["worst_relative_loss_diff_vs_resident"].values())
    result = {"model": a.model, "device": a.device,
              "geometry": {k: getattr(a, k) for k in ("layers", "dim", "heads", "seq", "batch",
                                                      "vocab", "steps")},
              "torch": torch.__version__, "runs": runs, "checks": checks}
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if checks["ok"] else 1)


if __name__ == "__main__":
    main()
