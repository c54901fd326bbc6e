#!/usr/bin/env bash
# The README's main-job command. Builds Strata (Release) and runs the main job: `strata train`
# on the built-in corpus with the engine's device budget at most a quarter of the model's
# states and the optimizer states on NVMe (a temporary folder under /var/tmp), then checks
# that the loss fell by at least 30 % and prints a generated sample.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA_TORCH_MATRIX=0 tools/bootstrap.sh  # the torch-matrix venv is for the tests only
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target strata
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Default model: 4 layers, d_model 128, 2 heads, seq 64, byte vocabulary (834k parameters,
# 12.8 MiB of parameters, gradients and Adam moments). Device budget 3 MiB (< 1/4 of that);
# host budget 8 MiB, too small for the states' homes, so master weights and moments live on
# NVMe in $work and stream through the pinned pool every step.
build/release/tools/strata train --steps 300 --lr 3e-3 --lr-schedule cosine --warmup 20 \
  --device-mem 3M --host-mem 8M --nvme "$work" --val-every 100 --sample 160 \
  --json "$work/run.json" | tee "$work/out.txt"
# Loss check: first step vs the mean of the last 10 (from the summary line).
first=$(sed -n 's/^# loss: first step \([0-9.]*\),.*/\1/p' "$work/out.txt")
last=$(sed -n 's/^# loss: .* steps \([0-9.]*\) (.*/\1/p' "$work/out.txt")
if awk -v f="$first" -v l="$last" 'BEGIN { exit !(l <= 0.7 * f) }'; then
  echo "demo: loss fell from $first to $last (by at least 30 %)"
else
  echo "demo: loss fell only from $first to $last (less than 30 %)" >&2
  exit 1
fi
