#!/usr/bin/env bash
# Layer-major micro-batches with offloaded activations (bench/PERFORMANCE.md, "Offloaded
# activations"): the issue-24 table. One micro-batch, four batch-major, four with default flags
# (auto: layer-major with the activations of the micro-batches the device has no room for in
# the engine, where the recompute that needs costs less than batch-major's weight traffic;
# on the host device it does not, and auto keeps batch-major), alternating, on the same model
# and budgets. Figures per run are medians over
# steps 3..N, then the median of REPS runs: h2d bytes per step against one micro-batch (bound:
# <= 1.1x), the activations' own bytes per link, step time against batch-major (bound: not
# worse). Every run must end with the same losses as batch-major, bit for bit (#wrong).
#
# Usage: bench/offloaded_activations.sh [BUILD_DIR] [REPS] [STEPS] [extra train flags...]
# Default: 6 layers x 384, seq 128, 4 rows per micro-batch, --device-mem 24M --host-mem 512M
# --nvme (a fresh folder under TMPDIR, default /var/tmp).
set -euo pipefail
build=${1:-build/release}
reps=${2:-3}
steps=${3:-6}
shift $(( $# < 3 ? $# : 3 ))
strata="$build/tools/strata"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-offload-acts.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--device cpu --layers 6 --d-model 384 --seq-len 128 --batch 4 --device-mem 24M
        --host-mem 512M --steps "$steps" --lr 1e-3 "$@")
echo "# strata train, offloaded activations: ${common[*]} --nvme DIR; reps $reps; OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}"
run() {
  local tag=$1; shift
  rm -rf "$work/nvme"; mkdir -p "$work/nvme"
  "$strata" train "${common[@]}" --nvme "$work/nvme" "$@" --json "$work/$tag.json" > "$work/$tag.out"
  if [[ $tag == *1 ]]; then grep '^# micro-batches' "$work/$tag.out" | sed "s/^#/# ${tag%1}:/"; fi
}
for r in $(seq 1 "$reps"); do
  run "one$r" --micro-batches 1
  run "batch$r" --micro-batches 4 --micro-batch-order batch
  run "auto$r" --micro-batches 4
done
python3 - "$work" "$reps" <<'PY'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
def load(p):
    j = json.load(open(p))
    s = j["steps"][2:]
    med = lambda f: statistics.median(f(x) for x in s)
    act = lambda x, k: x.get("activation_bytes", {}).get(k, 0)
    return {"s": med(lambda x: x["seconds"]), "h2d": med(lambda x: x["bytes"]["h2d"]),
            "d2h": med(lambda x: x["bytes"]["d2h"]), "eff": med(lambda x: x["efficiency"]),
            "act_h2d": med(lambda x: act(x, "h2d")), "act_d2h": med(lambda x: act(x, "d2h")),
            "act_nvme": med(lambda x: act(x, "nvme_read") + act(x, "nvme_write")),
            "loss": [x["loss"] for x in j["steps"]], "order": j["config"]["micro_batch_order"],
            "slots": j["config"].get("activation_slots", 0)}
print("%-4s %-6s %8s %8s %8s %8s %8s %8s %8s %7s %6s" % ("rep", "case", "s/step", "h2d_MiB",
      "d2h_MiB", "h2d/M=1", "act_h2d", "act_d2h", "act_nvme", "effic", "#wrong"))
rows = {"batch": [], "auto": []}
for r in range(1, reps + 1):
    one = load(f"{work}/one{r}.json")
    b = load(f"{work}/batch{r}.json")
    print("%-4d %-6s %8.3f %8.1f %8.1f %8s %8s %8s %8s %7.3f %6s" % (r, "M=1", one["s"],
          one["h2d"] / 2**20, one["d2h"] / 2**20, "", "", "", "", one["eff"], "-"))
    for name in ("batch", "auto"):
        x = load(f"{work}/{name}{r}.json")
        wrong = sum(a != c for a, c in zip(b["loss"], x["loss"]))
        x["h2d_ratio"] = x["h2d"] / one["h2d"]
        rows[name].append(x)
        tag = x["order"] + ("/s%d" % x["slots"] if x["slots"] else "")
        print("%-4d %-6s %8.3f %8.1f %8.1f %8.3f %8.1f %8.1f %8.1f %7.3f %6d" % (r, tag, x["s"],
              x["h2d"] / 2**20, x["d2h"] / 2**20, x["h2d_ratio"], x["act_h2d"] / 2**20,
              x["act_d2h"] / 2**20, x["act_nvme"] / 2**20, x["eff"], wrong))
m = lambda name, k: statistics.median(x[k] for x in rows[name])
print("# medians: default flags h2d %.3fx of one micro-batch (bound <= 1.1; batch-major %.3fx); "
      "step time default/batch-major %.3f (bound <= 1.0)"
      % (m("auto", "h2d_ratio"), m("batch", "h2d_ratio"), m("auto", "s") / m("batch", "s")))
PY
