"""bitsandbytes' CPU AdamW8bit step beside strata's int8 kernel, in the same run (issue 42's
"≥ 5 × bitsandbytes" target): one step of AdamW8bit on PARAMS fp32 parameters (one tensor,
block-wise 8-bit moments, its defaults) on THREADS threads, timed over ITERS steps after WARMUP,
then `strata bench adam --state-dtype int8` on the same size and threads. Prints both medians
and their ratio.

  V=~/.cache/strata/venv-torch-matrix
  STRATA_PYDEPS=$V/no-pydeps $V/bin/python bench/bnb_adam8bit.py [--params 4M] [--threads 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def bnb_step_seconds(n, threads, iters, warmup):
    import torch
    import bitsandbytes as bnb
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=g))
    opt = bnb.optim.AdamW8bit([p], lr=1e-3, weight_decay=0.01, min_8bit_size=0)
    times = []
    for i in range(warmup + iters):
        p.grad = torch.randn(n, generator=g) * 1e-2
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
    return statistics.median(times)


def strata_step_seconds(strata, n, threads, iters, warmup):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([strata, "bench", "adam", "--params", str(n), "--state-dtype", "int8",
                        "--threads", str(threads), "--iters", str(iters), "--warmup",
                        str(warmup), "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        rows = json.load(open(f.name))["runs"]
    row = next(r for r in rows if r["state_dtype"] == "int8")
    return row["seconds"], row["ratio_to_bound"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="4M")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--strata", default=os.path.join(HERE, "..", "build", "release", "tools",
                                                     "strata"))
    a = ap.parse_args()
    n = size(a.params)
    try:
        bnb = bnb_step_seconds(n, a.threads, a.iters, a.warmup)
    except ImportError as e:
        sys.exit(f"bnb_adam8bit.py: bitsandbytes is not importable here ({e}); run it with the "
                 "torch-matrix venv's python (tools/bootstrap.sh installs it)")
    ours, ratio = strata_step_seconds(a.strata, n, a.threads, a.iters, a.warmup)
    print(json.dumps({"params": n, "threads": a.threads, "bnb_adamw8bit_s": bnb,
                      "strata_int8_s": ours, "strata_int8_ratio_to_bound": ratio,
                      "speedup": bnb / ours}))


if __name__ == "__main__":
    main()
