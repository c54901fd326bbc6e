#!/usr/bin/env bash
# Offloaded vs in-memory `strata train` on the same model (bench/PERFORMANCE.md, "Model and
# strata train"): the step time ratio (bound: <= 1.15) and the efficiency the offloaded run
# reports (bound: >= 0.85).
# Runs are interleaved (mem, offloaded, mem, ...) so both see the same machine; each figure
# is the median over steps 6..N (after the first steps' warm-up), then the median of REPS runs.
#
# Usage: bench/train_offload.sh [BUILD_DIR] [REPS] [STEPS] [extra train flags...]
# The offloaded run gets a device budget of a quarter of the states and a host budget that
# leaves master weights and Adam moments on NVMe (a folder under /var/tmp).
set -euo pipefail
build=${1:-build/release}
reps=${2:-3}
steps=${3:-30}
shift $(( $# < 3 ? $# : 3 ))
strata="$build/tools/strata"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-offload.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--steps "$steps" --lr 3e-3 --warmup 5 "$@")
echo "# strata train offloaded vs in-memory: ${common[*]}; reps $reps; OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}"
for r in $(seq 1 "$reps"); do
  "$strata" train "${common[@]}" --json "$work/mem$r.json" >/dev/null
  rm -rf "$work/nvme" && mkdir -p "$work/nvme"
  "$strata" train "${common[@]}" --device-mem 3M --host-mem 8M --nvme "$work/nvme" \
    --no-durable --json "$work/off$r.json" >/dev/null
done
python3 - "$work" "$reps" <<'PY'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
def load(p):
    s = json.load(open(p))["steps"][5:]
    return (statistics.median(x["seconds"] for x in s),
            statistics.median(x["efficiency"] for x in s),
            [x["loss"] for x in json.load(open(p))["steps"]],
            statistics.median(x["bytes"]["nvme_read"] + x["bytes"]["nvme_write"] for x in s))
print("%-4s %12s %12s %8s %10s %12s %7s" % ("rep", "mem_s/step", "off_s/step", "ratio",
      "off_eff", "nvme_MiB/st", "#wrong"))
ratios, effs = [], []
for r in range(1, reps + 1):
    m, me, ml, _ = load(f"{work}/mem{r}.json")
    o, oe, ol, nb = load(f"{work}/off{r}.json")
    wrong = sum(a != b for a, b in zip(ml, ol))  # offloading must not change a loss bit
    ratios.append(o / m); effs.append(oe)
    print("%-4d %12.4f %12.4f %8.3f %10.3f %12.1f %7d" % (r, m, o, o / m, oe, nb / 2**20, wrong))
print("# median ratio %.3f (bound <= 1.15), median offloaded efficiency %.3f (bound >= 0.85)"
      % (statistics.median(ratios), statistics.median(effs)))
PY
