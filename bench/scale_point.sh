#!/usr/bin/env bash
# The scale point with compact states (bench/PERFORMANCE.md, "Scale point with compact
# states"; issue 42): GPT-2 large (36 x 1280) at the scale point's budgets, default flags, once
# with fp32 states and once with int8 moments + a bf16 master, one after the other on the same
# machine state. Prints per step: seconds, efficiency, the busiest resource's busy time (the
# step's lower bound, bound_seconds) and NVMe MiB read / written, then the step-time ratio of the
# two runs at each step and the compact run's bound over the fp32 step (the ratio's floor).
#
# Usage: bench/scale_point.sh [BUILD_DIR] [DATA] [STEPS] [ROUNDS]
#   DATA: a text corpus (default $STRATA_BENCH_DATA when set, else the built-in one; the
#   figures in bench/PERFORMANCE.md used tinyshakespeare.txt). ROUNDS: how many times to
#   repeat the pair (medians are the caller's: the table of each round is printed).
# The store goes to $TMPDIR (default /var/tmp): it needs about 12 GB free, on the disk whose
# speed the fp32 run is bound by.
set -euo pipefail
build=${1:-build/release}
data=${2:-${STRATA_BENCH_DATA:-}}
steps=${3:-4}
rounds=${4:-1}
strata="$build/tools/strata"
[[ -x "$strata" ]] || { echo "scale_point.sh: no $strata: build first (cmake --build --preset release)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-scale-point.XXXXXX")
trap 'rm -rf "$work"' EXIT
model=(--layers 36 --d-model 1280 --heads 20 --seq-len 128 --batch 1 --recompute
  --device-mem 400M --host-mem 1.9G --steps "$steps" --lr 1e-4)
[[ -n "$data" ]] && model+=(--data "$data")
echo "# $strata train ${model[*]} --nvme DIR [--state-dtype int8 --master-dtype bf16] --json OUT"
for round in $(seq 1 "$rounds"); do
  for variant in fp32 compact; do
    extra=()
    [[ "$variant" == compact ]] && extra=(--state-dtype int8 --master-dtype bf16)
    rm -rf "$work/store"
    "$strata" train "${model[@]}" "${extra[@]}" --nvme "$work/store" --json "$work/$variant.json" \
      >"$work/$variant.log" 2>&1 || { cat "$work/$variant.log" >&2; exit 1; }
  done
  python3 - "$work/fp32.json" "$work/compact.json" "$round" <<'EOF'
import json, sys
runs = [json.load(open(p))["steps"] for p in sys.argv[1:3]]
print(f"# round {sys.argv[3]}")
print("step  fp32_s  eff   bound_s  read/write_MiB   |  int8+bf16_s  eff   bound_s  read/write_MiB  |  ratio  floor")
for a, b in zip(*runs):
    def cols(s):
        mib = lambda k: s["bytes"][k] / 2**20
        return (f"{s['seconds']:7.3f} {s['efficiency']:5.3f} {s['bound_seconds']:7.3f}  "
                f"{mib('nvme_read'):6.0f}/{mib('nvme_write'):6.0f}")
    print(f"{a['step']:4d} {cols(a)}   | {cols(b)}   | {b['seconds'] / a['seconds']:.3f}  "
          f"{b['bound_seconds'] / a['seconds']:.3f}")
EOF
done
