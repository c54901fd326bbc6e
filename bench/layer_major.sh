#!/usr/bin/env bash
# Layer-major vs batch-major micro-batches on the same model (bench/PERFORMANCE.md,
# "Layer-major micro-batches"): bytes per step over h2d and d2h against one micro-batch
# (bound: layer-major <= 1.1x), and step time against batch-major (bound: not worse).
# Runs alternate (one micro-batch, batch-major, layer-major, ...) so all see the same
# machine; each figure is the median over steps 3..N of a run, then the median of REPS runs.
# Every run must end with the same losses, bit for bit (#wrong counts steps that differ).
#
# Usage: bench/layer_major.sh [BUILD_DIR] [REPS] [STEPS] [extra train flags...]
# Default model: 6 layers x 384, seq 128, 1 row per micro-batch, --recompute, 4 micro-batches,
# --device-mem 24M (where layer-major's extra activations still fit: the start-up line
# "# micro-batches:" says what each run chose and why).
set -euo pipefail
build=${1:-build/release}
reps=${2:-3}
steps=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
strata="$build/tools/strata"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-layer-major.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--device cpu --layers 6 --d-model 384 --seq-len 128 --batch 1 --recompute
        --device-mem 24M --steps "$steps" --lr 1e-3 "$@")
echo "# strata train layer-major vs batch-major: ${common[*]}; reps $reps; OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}"
# What each run chose and why (the start-up line), shown for the first repetition.
run() {
  local tag=$1; shift
  "$strata" train "${common[@]}" "$@" --json "$work/$tag.json" > "$work/$tag.out"
  if [[ $tag == *1 ]]; then grep '^# micro-batches' "$work/$tag.out" | sed "s/^#/# ${tag%1}:/"; fi
}
for r in $(seq 1 "$reps"); do
  run "one$r" --micro-batches 1
  run "batch$r" --micro-batches 4 --micro-batch-order batch
  run "layer$r" --micro-batches 4 --micro-batch-order auto
done
python3 - "$work" "$reps" <<'PY'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
def load(p):
    j = json.load(open(p))
    s = j["steps"][2:]
    med = lambda f: statistics.median(f(x) for x in s)
    return {"s": med(lambda x: x["seconds"]), "h2d": med(lambda x: x["bytes"]["h2d"]),
            "d2h": med(lambda x: x["bytes"]["d2h"]), "eff": med(lambda x: x["efficiency"]),
            "loss": [x["loss"] for x in j["steps"]], "order": j["config"]["micro_batch_order"]}
print("%-4s %-6s %9s %9s %9s %9s %9s %9s %7s" % ("rep", "case", "s/step", "h2d_MiB", "d2h_MiB",
      "h2d/M=1", "d2h/M=1", "effic", "#wrong"))
rows = {"batch": [], "layer": []}
for r in range(1, reps + 1):
    one = load(f"{work}/one{r}.json")
    b = load(f"{work}/batch{r}.json")
    print("%-4d %-6s %9.3f %9.1f %9.1f %9s %9s %9.3f %7s" % (r, "M=1", one["s"], one["h2d"] / 2**20,
          one["d2h"] / 2**20, "", "", one["eff"], "-"))
    for name in ("batch", "layer"):
        x = load(f"{work}/{name}{r}.json")
        wrong = sum(a != c for a, c in zip(b["loss"], x["loss"]))
        x["h2d_ratio"], x["d2h_ratio"] = x["h2d"] / one["h2d"], x["d2h"] / one["d2h"]
        rows[name].append(x)
        print("%-4d %-6s %9.3f %9.1f %9.1f %9.3f %9.3f %9.3f %7d" % (r, x["order"], x["s"],
              x["h2d"] / 2**20, x["d2h"] / 2**20, x["h2d_ratio"], x["d2h_ratio"], x["eff"], wrong))
m = lambda name, k: statistics.median(x[k] for x in rows[name])
print("# medians: layer-major h2d %.3fx, d2h %.3fx of one micro-batch (bound <= 1.1); "
      "batch-major h2d %.3fx, d2h %.3fx; step time layer/batch %.3f (bound <= 1.0)"
      % (m("layer", "h2d_ratio"), m("layer", "d2h_ratio"), m("batch", "h2d_ratio"),
         m("batch", "d2h_ratio"), m("layer", "s") / m("batch", "s")))
PY
