#!/usr/bin/env python3
"""Strata's Python path against DeepSpeed ZeRO-3 offload on issue 27's model: seconds per step,
the ratio to plain torch, peak RSS, the losses checked against plain torch's.

Model: Hugging Face GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=384, n_head=6,
n_positions=128, vocab_size=256, use_cache=False)), seq 128, batch 4, AdamW (lr 1e-4,
weight decay 0), gradient clipping 1.0, the same initial weights and batches for every run.
Runs (each in its own process, so that its peak RSS is its own):
  torch          plain torch in memory (clip_grad_norm_ + torch.optim.AdamW)
  strata-mem     strata.offload, an unlimited CPU engine (recompute="auto": keeps activations)
  strata-nvme    strata.offload, NVMe with 24M device / 32M host budgets (recompute=True, what
                 "auto" comes to at that budget; before 8714d16 "auto" past its budget leaked
                 each dropped graph, about 150 MiB of RSS per step on this model)
  strata-nvme-keep  (only when named in --runs) the same with recompute=False: autograd's
                 activations kept in torch's memory, outside the budgets, as DeepSpeed keeps
                 them; what the recompute costs
  strata-nvme@64M, strata-nvme-keep@64M, ...  (only when named) the same with another host
                 budget (any size strata.Engine(host_mem=...) takes)
  ds-cpu         DeepSpeed ZeRO-3, offload_optimizer + offload_param to cpu
  ds-nvme        DeepSpeed ZeRO-3, offload_optimizer + offload_param to nvme
DeepSpeed runs as issue 27 ran it: DS_ACCELERATOR=cpu, gloo, world size 1, the model built
outside zero.Init; for NVMe, stage3_prefetch_bucket_size 0 (DeepSpeed #3062) and the CPU
accelerator's is_fp16_supported() answering True (else partition_parameters.py swaps an fp32
model as bf16). Rounds alternate: each round runs every configuration once, in turn, for
--steps steps; the table gives the median of steps 3..--steps over all rounds. DeepSpeed's rows
are skipped, with the reason, where `import deepspeed` fails (`STRATA_DEEPSPEED=1
tools/bootstrap.sh` installs the pinned one into the torch-matrix venv).

    OMP_NUM_THREADS=2 PYTHONPATH=build/release/python \\
      ~/.cache/strata/venv-torch-matrix/bin/python bench/vs_deepspeed.py --rounds 2

Output: the configuration in `#` lines, then a markdown table (--json: one JSON object), then
for each strata NVMe run its engine's figures of the last step (NVMe bytes read and written,
the seconds the training thread waited for the engine, the NVMe lanes' busy seconds).
--strata-threads N gives the strata runs strata.Engine(threads=N) (default: the CPU engine's
own, the CPUs torch leaves free; python/strata/_flags.py says why). The #wrong column counts the
steps whose loss differs from plain torch's by more than 1e-3 relative (issue 27: every run gave
the same losses to 4 decimals). CPU s/step is the median of the process's CPU seconds (all its
threads) per step: on a loaded machine a run whose OpenMP workers spin-wait (plain torch: libgomp
spins unless the process has more OpenMP threads than CPUs; see python/strata/_flags.py) shows
CPU seconds near threads x s/step.
"""
import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = ["torch", "strata-mem", "strata-nvme", "ds-cpu", "ds-nvme"]
EXTRA_RUNS = ["strata-nvme-keep"]
LABELS = {
    "torch": "plain torch in memory",
    "strata-mem": "`strata.offload`, in memory",
    "strata-nvme": "`strata.offload`, NVMe, 24M device / {host} host",
    "strata-nvme-keep": "`strata.offload`, NVMe, 24M device / {host} host, recompute=False",
    "ds-cpu": "DeepSpeed ZeRO-3, offload_optimizer + offload_param to cpu",
    "ds-nvme": "DeepSpeed ZeRO-3, offload to nvme",
}
HOST_MEM = "32M"  # the NVMe runs' host budget unless the run names another ("strata-nvme@64M")


def _split(run):
    """"strata-nvme@64M" -> ("strata-nvme", "64M"); the host budget only for the NVMe runs."""
    base, _, host = run.partition("@")
    return base, host or (HOST_MEM if base.startswith("strata-nvme") else None)


def _label(run):
    base, host = _split(run)
    return LABELS[base].format(host=host)


LR, CLIP, VOCAB, SEQ, BATCH = 1e-4, 1.0, 256, 128, 4


def _transformers():
    pydeps = os.environ.get("STRATA_PYDEPS") or os.path.join(
        os.path.expanduser("~/.cache"), "strata", "pydeps")
    if os.path.isdir(pydeps) and pydeps not in sys.path:
        sys.path.append(pydeps)
    import transformers
    return transformers


def _model():
    import torch
    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=384, n_layer=6,
                                     n_head=6, use_cache=False)
    return transformers.GPT2LMHeadModel(config)


def _batches(steps):
    import torch
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(steps)]


def _torch_step():
    import torch
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    def step(x):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        return loss.item()
    return step


def _strata_step(nvme, threads, recompute=None, host_mem=HOST_MEM):
    import strata
    model = _model()
    # threads 0: the CPU engine's default (python/strata/_threads.py: the CPUs torch leaves
    # free, the OMP_NUM_THREADS team once other processes take the CPU)
    engine = (strata.Engine(device="cpu", device_mem="24M", host_mem=host_mem, nvme=[nvme],
                            threads=threads)
              if nvme else strata.Engine(device="cpu", threads=threads))
    model = strata.offload(model, blocks=list(model.transformer.h), engine=engine,
                           recompute=recompute if recompute is not None
                           else True if nvme else "auto")
    opt = strata.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, max_grad_norm=CLIP)

    def step(x):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        return loss.item()
    step.engine = engine
    return step


def _deepspeed_step(nvme):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    model = _model()  # outside zero.Init: inside it the weights would not be initialised
    offload = {"device": "nvme", "nvme_path": nvme} if nvme else {"device": "cpu"}
    zero = {"stage": 3, "offload_optimizer": dict(offload), "offload_param": dict(offload)}
    if nvme:
        zero["stage3_prefetch_bucket_size"] = 0  # DeepSpeed #3062: buffer assertions
        # partition_parameters.py picks `dtype or fp16 if is_fp16_supported() else bf16`
        # wrongly and would swap this fp32 model as bf16.
        get_accelerator().is_fp16_supported = lambda: True
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "gradient_clipping": CLIP, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999],
                                                        "eps": 1e-8, "weight_decay": 0.0}}}
    deepspeed.init_distributed(dist_backend="gloo")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)

    def step(x):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        return loss.item()
    return step


def child(run, steps, folder, threads):
    """One run in this process: prints {"seconds": [...], "cpu_seconds": [...], "losses": [...],
    "rss_mib": ...}; cpu_seconds are the process's (every thread's) CPU seconds in each step."""
    nvme = folder if "nvme" in run else None
    base, host = _split(run)
    make = {"torch": _torch_step, "strata-mem": lambda: _strata_step(None, threads),
            "strata-nvme": lambda: _strata_step(nvme, threads, host_mem=host),
            "strata-nvme-keep": lambda: _strata_step(nvme, threads, False, host),
            "ds-cpu": lambda: _deepspeed_step(None), "ds-nvme": lambda: _deepspeed_step(nvme)}[base]
    step = make()
    seconds, cpu_seconds, losses = [], [], []
    for x in _batches(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step(x))
        seconds.append(time.perf_counter() - t0)
        cpu_seconds.append(time.process_time() - c0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    engine = getattr(step, "engine", None)
    stats = None
    if engine is not None and nvme:
        last = engine.last_step_stats()  # the last committed step's final figures
        stats = {"nvme_read": last["bytes"]["nvme_read"],
                 "nvme_write": last["bytes"]["nvme_write"], "stall": last["stall_seconds"],
                 "nvme_busy": last["busy_seconds"]["nvme"]}
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "losses": losses,
                      "rss_mib": rss, "stats": stats}))


def deepspeed_missing():
    """Why DeepSpeed cannot run here, or None."""
    probe = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True,
                           text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
    return (f"deepspeed does not import under {sys.executable} ({last}); "
            "STRATA_DEEPSPEED=1 tools/bootstrap.sh installs deepspeed 0.19.8 into the "
            "torch-matrix venv")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    ap.add_argument("--steps", type=int, default=10, help="steps per run; 3.. are measured")
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of " +
                    ",".join(RUNS + EXTRA_RUNS) + " (default: " + ",".join(RUNS) + ")")
    ap.add_argument("--nvme", default=None, help="folder for the NVMe runs (default: a "
                    "temporary folder under /var/tmp)")
    ap.add_argument("--strata-threads", type=int, default=0, help="strata.Engine(threads=N) "
                    "for the strata runs (default 0: the CPU engine's default, the CPUs torch "
                    "leaves free)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.steps, args.folder, args.strata_threads)
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if _split(r)[0] not in RUNS + EXTRA_RUNS
               or ("@" in r and not r.startswith("strata-nvme"))]
    if unknown:
        sys.exit(f"vs_deepspeed: unknown runs {unknown}; choose from {RUNS + EXTRA_RUNS} "
                 "(the strata-nvme runs may name a host budget: strata-nvme@64M)")
    skipped = {}
    why = deepspeed_missing() if any(r.startswith("ds-") for r in runs) else None
    if why:
        for r in runs:
            if r.startswith("ds-"):
                skipped[r] = why
        print(f"# skipped DeepSpeed: {why}", file=sys.stderr)
    results = {r: {"seconds": [], "cpu_seconds": [], "losses": [], "rss_mib": [], "rounds": []}
               for r in runs if r not in skipped}
    base = args.nvme or "/var/tmp"
    for rnd in range(args.rounds):
        for run in results:
            with tempfile.TemporaryDirectory(prefix=f"vs_ds_{run}_", dir=base) as folder:
                out = subprocess.run([sys.executable, __file__, "--child", run, "--steps",
                                      str(args.steps), "--folder", folder, "--strata-threads",
                                      str(args.strata_threads)],
                                     capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"vs_deepspeed: {run} failed in round {rnd + 1}:\n{out.stderr[-4000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[run]["seconds"] += r["seconds"][2:]
            results[run]["cpu_seconds"] += r["cpu_seconds"][2:]
            results[run]["losses"].append(r["losses"])
            results[run]["rss_mib"].append(r["rss_mib"])
            results[run]["rounds"].append(statistics.median(r["seconds"][2:]))
            results[run].setdefault("stats", []).append(r.get("stats"))
    report(args, results, skipped)


def report(args, results, skipped):
    import torch
    ref = results.get("torch")
    rows = {}
    for run, r in results.items():
        wrong = 0
        if ref:
            for losses in r["losses"]:
                wrong += sum(abs(a - b) > 1e-3 * abs(b) for a, b in zip(losses, ref["losses"][0]))
        rows[run] = {"s_per_step": statistics.median(r["seconds"]),
                     "cpu_s_per_step": statistics.median(r["cpu_seconds"]),
                     "peak_rss_mib": max(r["rss_mib"]), "wrong": wrong,
                     "last_loss": r["losses"][0][-1], "round_s_per_step": r["rounds"],
                     "engine_last_step": r.get("stats", [None])[-1]}
    for run, s in rows.items():
        s["x_torch"] = s["s_per_step"] / rows["torch"]["s_per_step"] if "torch" in rows else None
    if args.json:
        print(json.dumps({"rows": rows, "skipped": skipped}))
        return
    print(f"# torch {torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"{args.rounds} alternating rounds of {args.steps} steps, median of steps 3..{args.steps}"
          f"; strata threads={args.strata_threads or 'default'}")
    print(f"# model: GPT2LMHeadModel 6 x 384, 6 heads, vocab {VOCAB}; seq {SEQ}, batch {BATCH}, "
          f"AdamW lr {LR}, clip {CLIP}")
    print("| run | s/step | CPU s/step | ÷ plain torch | peak RSS | #wrong |")
    print("|---|---|---|---|---|---|")
    for run, s in rows.items():
        x = f"{s['x_torch']:.2f}" if s["x_torch"] is not None else "-"
        print(f"| {_label(run)} | {s['s_per_step']:.3f} | {s['cpu_s_per_step']:.3f} | {x} | "
              f"{s['peak_rss_mib']:.0f} MiB | "
              f"{s['wrong']} |")
    for run, why in skipped.items():
        print(f"| {_label(run)} | skipped | | | | |")
    nvme_runs = [r for r in rows if r.startswith("strata-nvme")]
    pairs = ([("strata-mem", "ds-cpu")] + [(r, "ds-nvme") for r in nvme_runs]
             + list(itertools.combinations(nvme_runs, 2)))  # in the order --runs names them
    for a, b in pairs:
        if a in rows and b in rows:
            per_round = [x / y for x, y in zip(rows[a]["round_s_per_step"],
                                               rows[b]["round_s_per_step"])]
            rounds = ", ".join(f"{r:.2f}" for r in per_round)
            memory = rows[a]["peak_rss_mib"] / rows[b]["peak_rss_mib"]
            print(f"# {a} / {b}: {rows[a]['s_per_step'] / rows[b]['s_per_step']:.2f} x the "
                  f"time (per round {rounds}; median {statistics.median(per_round):.2f}), "
                  f"{memory:.2f} x the memory")
    for run in nvme_runs:
        e = rows[run]["engine_last_step"]
        if e:
            print(f"# {run}, its engine's last step: NVMe read {e['nvme_read'] / 1e6:.1f} MB, "
                  f"write {e['nvme_write'] / 1e6:.1f} MB, NVMe busy {e['nvme_busy']:.3f} s, "
                  f"the training thread waited {e['stall']:.3f} s")


if __name__ == "__main__":
    main()
