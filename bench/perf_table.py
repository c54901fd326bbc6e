#!/usr/bin/env python3
"""Produces the CPU rows of bench/PERFORMANCE.md's current-figures table from the benchmarks'
--json output, so the table is generated, not typed.

    bench/perf_table.py run STRATA DIR [--rounds N] [--io-size 1G] [--nvme-dir D]
        runs the benchmarks (the commands below, N alternating rounds) and writes their JSON
        and meta.json (date, commit, load average, each command) into DIR;
    bench/perf_table.py rows DIR [--update bench/PERFORMANCE.md]
        prints the rows made from DIR's JSON files; with --update, replaces the lines between
        "<!-- cpu-rows: begin -->" and "<!-- cpu-rows: end -->" of that file with them.

Rows covered, each from the JSON files named (a row whose files are missing is left out):
  model.json                    strata bench model: forward+backward GEMM share vs sgemm alone
  adam_fp32.json adam_bf16.json strata bench adam: kernel / same-traffic bound per ISA
  adam_step.json                strata bench adam --mode step: fused bf16 vs four-pass fp32
  step_offload_compute.R.json, step_inbudget_compute.R.json
                                strata bench step: compute-bound efficiency and ratio
  step_offload_io.R.json [fio_mix.R.json]
                                strata bench step: I/O-bound efficiency, NVMe rate vs fio
  io_{read,write}_{uring,posix}.R.json [fio_{read,write}.R.json]
                                strata bench io: sequential 1 MiB QD 32 O_DIRECT vs fio, posix
The rows of the Python, demo, multi-rank and GPU benchmarks are not produced here (their
scripts print text, or they need a GPU or a second host): PERFORMANCE.md types them, each with
its date and commit.
"""
import argparse
import datetime
import glob
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

BEGIN, END = "<!-- cpu-rows: begin -->", "<!-- cpu-rows: end -->"


def load(path):
    with open(path) as f:
        return json.load(f)


def rounds(d, name):
    return [load(p) for p in sorted(glob.glob(os.path.join(d, f"{name}.*.json")))]


def med(xs):
    return statistics.median(xs)


# ---- running -------------------------------------------------------------------------------


def run_benchmarks(args):
    out = pathlib.Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    strata = os.path.abspath(args.strata)
    scratch = tempfile.mkdtemp(prefix="strata-perf-table.", dir=args.nvme_dir)
    commands = []

    def sh(cmd, dest, env=None):
        commands.append(cmd)
        with open(out / dest, "w") as f:
            subprocess.run(cmd, shell=True, check=True, stdout=f, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, **(env or {})))

    try:
        s = strata
        sh(f"OMP_NUM_THREADS=1 {s} bench model --reps 5 --model 4x128 --model 6x384 --json -",
           "model.json")
        adam = f"{s} bench adam --params 64M --threads 2 --iters 10 --json -"
        sh(f"{adam} --isa avx512,avx2 --grad-dtype fp32 --param-out none", "adam_fp32.json")
        sh(f"{adam} --isa avx512,avx2 --grad-dtype bf16 --param-out bf16", "adam_bf16.json")
        sh(f"{adam} --mode step --grad-dtype bf16,fp32", "adam_step.json")
        swap = os.path.join(scratch, "swap")
        step = (f"{s} bench step --blocks 16 --block-bytes 16M --steps 4 --threads 1 "
                f"--grad-clip 0 --json -")
        offload = f"--device-mem 64M --host-mem 256M --nvme {swap}"
        io = (f"{s} bench io --path {scratch} --size {args.io_size} --block 1M --qd 32 --direct "
              f"--iters 2 --warmup 1 --json -")
        fio = (f"fio --name=cmp --filename={scratch}/fio.dat --size={args.io_size} --bs=1M "
               f"--iodepth=32 --direct=1 --ioengine=io_uring --output-format=json")
        have_fio = shutil.which("fio") is not None
        for r in range(1, args.rounds + 1):
            shutil.rmtree(swap, ignore_errors=True)
            sh(f"{step} --compute-ms 40 {offload}", f"step_offload_compute.{r}.json")
            sh(f"{step} --compute-ms 40", f"step_inbudget_compute.{r}.json")
            shutil.rmtree(swap, ignore_errors=True)
            sh(f"{step} --compute-ms 0 {offload}", f"step_offload_io.{r}.json")
            for mode in ("read", "write"):
                sh(f"{io} --mode {mode} --backend uring", f"io_{mode}_uring.{r}.json")
            if have_fio:
                sh(f"{fio} --rw=rw --rwmixread=50 --loops=2", f"fio_mix.{r}.json")
                subprocess.run(f"{fio} --rw=write --loops=1 --fsync_on_close=1", shell=True,
                               check=True, stdout=subprocess.DEVNULL)
                for mode in ("read", "write"):
                    sh(f"{fio} --rw={mode} --loops=2", f"fio_{mode}.{r}.json")
                os.unlink(os.path.join(scratch, "fio.dat"))
            for mode in ("read", "write"):
                sh(f"{io} --mode {mode} --backend posix", f"io_{mode}_posix.{r}.json")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    meta = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit.strip(), "load_average": os.getloadavg(), "rounds": args.rounds,
            "commands": commands}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


# ---- rows ----------------------------------------------------------------------------------


def row_model(d):
    p = os.path.join(d, "model.json")
    if not os.path.exists(p):
        return []
    res = load(p)["results"]
    shares = " and ".join(f"{r['share']:.3f} ({r['model']})" for r in res)
    wrong = sum(r["wrong"] for r in res)
    return [("Model: HostDevice forward+backward vs sgemm alone (1 thread)",
             f"GEMM share {shares} (bound ≥ 0.50); #wrong {wrong}")]


def row_adam(d):
    cells = []
    for name, label in (("adam_fp32.json", "fp32 grad"), ("adam_bf16.json", "bf16 grad + copy")):
        p = os.path.join(d, name)
        if os.path.exists(p):
            for r in load(p)["runs"]:
                cells.append(f"{r['ratio_to_bound']:.3f} ({r['isa']}, {label}, "
                             f"{r['gbps']:.1f} GB/s)")
    if not cells:
        return []
    return [("CPU AdamW kernel vs its same-traffic bound (2 threads, 64 Mi params)",
             ", ".join(cells) + " × bound (targets ≥ 0.95 fp32, ≥ 0.9 bf16)")]


def row_adam_step(d):
    p = os.path.join(d, "adam_step.json")
    if not os.path.exists(p):
        return []
    steps = {s["grad_dtype"]: s for s in load(p)["steps"]}
    if "bf16" not in steps or "fp32" not in steps:
        return []
    ratio = steps["fp32"]["four_pass_seconds"] / steps["bf16"]["fused_seconds"]
    return [("CPU AdamW: fused step vs four passes",
             f"fused bf16-grad step ({steps['bf16']['fused_bytes_per_param']} B/param) "
             f"{ratio:.3f}× the four-pass fp32-grad step "
             f"({steps['fp32']['four_pass_bytes_per_param']} B/param) (target ≥ 1.4×)")]


def step_summary(doc):
    steady = doc["steps"][1:] or doc["steps"]
    return {"seconds": med(s["seconds"] for s in steady),
            "eff": med(s["efficiency"] for s in steady),
            "nvme_bps": med((s["bytes"]["nvme_read"] + s["bytes"]["nvme_write"]) / s["seconds"]
                            for s in steady),
            "wrong": doc["steps"][-1].get("wrong", 0)}


def fio_bps(doc, kinds=("read", "write")):
    job = doc["jobs"][0]
    return sum(job[k]["bw_bytes"] for k in kinds)


def row_step(d):
    rows = []
    oc = [step_summary(x) for x in rounds(d, "step_offload_compute")]
    ic = [step_summary(x) for x in rounds(d, "step_inbudget_compute")]
    if oc and len(oc) == len(ic):
        ratio = med(o["seconds"] / i["seconds"] for o, i in zip(oc, ic))
        rows.append(("Tiered engine step, compute-bound (`strata bench step`)",
                     f"offloaded efficiency {med(o['eff'] for o in oc):.3f} (target ≥ 0.85); "
                     f"offloaded / in-budget step time {ratio:.3f} (target ≤ 1.1); "
                     f"#wrong {sum(o['wrong'] for o in oc + ic)}"))
    oi = [step_summary(x) for x in rounds(d, "step_offload_io")]
    if oi:
        text = (f"efficiency {med(o['eff'] for o in oi):.3f} (target ≥ 0.85); NVMe "
                f"{med(o['nvme_bps'] for o in oi) / 1e9:.3f} GB/s")
        fio = [fio_bps(x) for x in rounds(d, "fio_mix")]
        if len(fio) == len(oi):
            text += (f" vs fio {med(fio) / 1e9:.3f} GB/s, median per-round ratio "
                     f"{med(o['nvme_bps'] / f for o, f in zip(oi, fio)):.3f} (target ≥ 0.85)")
        rows.append(("Tiered engine step, I/O-bound (`strata bench step`)", text))
    return rows


def io_bps(doc):
    return med(r["MBps"] for r in doc["runs"]) * 1e6


def row_io(d):
    rows = []
    for mode in ("write", "read"):
        uring = [io_bps(x) for x in rounds(d, f"io_{mode}_uring")]
        if not uring:
            continue
        fio = [fio_bps(x, (mode,)) for x in rounds(d, f"fio_{mode}")]
        if len(fio) == len(uring):
            rows.append((f"I/O: sequential {mode} vs fio (1 MiB, QD 32, O_DIRECT)",
                         f"strata (io_uring) {med(uring) / 1e9:.3f} GB/s / fio "
                         f"{med(fio) / 1e9:.3f} GB/s = {med(uring) / med(fio):.3f} of medians, "
                         f"{med(u / f for u, f in zip(uring, fio)):.3f} paired (target ≥ 0.95)"))
    cells = []
    for mode in ("write", "read"):
        uring = [io_bps(x) for x in rounds(d, f"io_{mode}_uring")]
        posix = [io_bps(x) for x in rounds(d, f"io_{mode}_posix")]
        if uring and len(posix) == len(uring):
            cells.append(f"{mode} {med(posix) / med(uring):.3f} of medians / "
                         f"{med(p / u for p, u in zip(posix, uring)):.3f} paired")
    if cells:
        rows.append(("I/O: PosixBackend vs io_uring backend",
                     ", ".join(cells) + " (target ≥ 0.80)"))
    return rows


def make_rows(d):
    meta_path = os.path.join(d, "meta.json")
    meta = load(meta_path) if os.path.exists(meta_path) else {}
    when = meta.get("date", "date not recorded")
    commit = meta.get("commit", "commit not recorded")
    load_avg = meta.get("load_average")
    if load_avg:
        when += f", load {load_avg[0]:.1f}"
    rows = row_io(d) + row_adam(d) + row_adam_step(d) + row_model(d) + row_step(d)
    return [f"| {name} | {fig} | {when} | {commit} | [generated](#how-the-cpu-rows-are-made) |"
            for name, fig in rows]


def print_rows(args):
    rows = make_rows(args.dir)
    if not rows:
        print(f"no benchmark JSON in {args.dir}", file=sys.stderr)
        return 1
    if not args.update:
        print("\n".join(rows))
        return 0
    text = pathlib.Path(args.update).read_text()
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        print(f"{args.update}: no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    block = BEGIN + "\n" + "\n".join(rows) + "\n" + END
    pathlib.Path(args.update).write_text(pattern.sub(lambda _: block, text))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmarks into DIR")
    r.add_argument("strata")
    r.add_argument("dir")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--io-size", default="1G")
    r.add_argument("--nvme-dir", default="/var/tmp", help="scratch folder's parent")
    t = sub.add_parser("rows", help="print (or --update) the rows from DIR's JSON")
    t.add_argument("dir")
    t.add_argument("--update", metavar="PERFORMANCE_MD")
    args = p.parse_args()
    return run_benchmarks(args) if args.cmd == "run" else print_rows(args)


if __name__ == "__main__":
    sys.exit(main())
