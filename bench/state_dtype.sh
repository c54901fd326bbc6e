#!/usr/bin/env bash
# bf16 vs fp32 Adam moments (`strata train --state-dtype`, bench/PERFORMANCE.md "Optimizer
# states in bf16"): the loss each reaches, its difference from the fp32 run, and the NVMe bytes
# per step, for the demo model and the 6 x 384 model, each with fp32, bf16 (stochastic
# rounding, the bf16 default) and bf16-rne (round to nearest even).
# The losses are deterministic (a rerun gives the same bits), so one run per variant gives
# them; the variants of a model run one after the other, on the same machine state. Step
# times are medians over steps 6..N (informative only: the machine is shared and the runs are
# compute-bound; bytes and losses are what this compares).
#
# Usage: bench/state_dtype.sh [BUILD_DIR] [DEMO_STEPS] [BIG_STEPS] [DATA]
#   DATA: the 6 x 384 model's text (default $STRATA_BENCH_DATA when set, else the built-in
#   corpus; the figures in bench/PERFORMANCE.md used tinyshakespeare.txt).
set -euo pipefail
build=${1:-build/release}
demo_steps=${2:-2000}
big_steps=${3:-300}
data=${4:-${STRATA_BENCH_DATA:-}}  # a text corpus (e.g. tinyshakespeare.txt); else the built-in one
strata="$build/tools/strata"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-state-dtype.XXXXXX")
trap 'rm -rf "$work"' EXIT
demo=(--steps "$demo_steps" --lr 3e-3 --lr-schedule cosine --warmup 20 --device-mem 3M
  --host-mem 8M --val-every "$demo_steps")
big=(--layers 6 --d-model 384 --seq-len 128 --batch 4 --steps "$big_steps" --lr 1e-3
  --lr-schedule cosine --warmup 20 --device-mem 24M --host-mem 64M --val-every "$big_steps")
[[ -n "$data" ]] && big+=(--data "$data")
echo "# demo: ${demo[*]}"
echo "# 6x384: ${big[*]}"
for model in demo big; do
  for sd in fp32 bf16 bf16-rne; do
    mkdir -p "$work/$model-$sd"
    if [[ $model == demo ]]; then flags=("${demo[@]}"); else flags=("${big[@]}"); fi
    "$strata" train "${flags[@]}" --state-dtype "$sd" --nvme "$work/$model-$sd" \
      --json "$work/$model-$sd.json" >"$work/$model-$sd.out"
  done
done
python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
print("%-6s %-9s %10s %10s %11s %10s %12s %12s %10s %9s" % (
    "model", "states", "loss_last", "d_vs_fp32", "val_loss", "d_val", "nvme_rd_MiB",
    "nvme_wr_MiB", "nvme_MiB", "s/step"))
for model in ("demo", "big"):
    ref = None
    for sd in ("fp32", "bf16", "bf16-rne"):
        j = json.load(open(f"{work}/{model}-{sd}.json"))
        steps = j["steps"]
        last = statistics.mean(s["loss"] for s in steps[-50:])  # mean of the last 50 steps
        val = next(s["val_loss"] for s in reversed(steps) if "val_loss" in s)
        rd = statistics.median(s["bytes"]["nvme_read"] for s in steps[5:]) / 2**20
        wr = statistics.median(s["bytes"]["nvme_write"] for s in steps[5:]) / 2**20
        sec = statistics.median(s["seconds"] for s in steps[5:])
        disk = j["placement"]["nvme_bytes"] / 2**20
        if ref is None:
            ref = (last, val)
        print("%-6s %-9s %10.4f %+10.4f %11.4f %+10.4f %12.2f %12.2f %10.1f %9.3f" % (
            "6x384" if model == "big" else model, sd, last, last - ref[0], val, val - ref[1],
            rd, wr, disk, sec))
PY
