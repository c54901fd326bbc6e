#!/usr/bin/env bash
# Gradients on NVMe (`strata train --grad-spill`, bench/PERFORMANCE.md "Gradients on NVMe"):
# 1. the host minimum the planner reports for the 6 x 384 model (seq 128, batch 4,
#    --device-mem 24M, states on NVMe) with clipping off, with clipping and gradients held in
#    host memory (--grad-spill off), and with clipping and gradients on NVMe (--grad-spill
#    on), for 1 and 4 micro-batches;
# 2. steps at those budgets: clipping with gradients held at the held minimum, clipping with
#    gradients on NVMe at its (lower) minimum, and no clipping at the same lower budget —
#    ROUNDS rounds, variants in turn, the median over steps 3..N of each run, then the median
#    over the rounds, with the NVMe bytes per step.
#
# Usage: bench/grad_spill.sh [BUILD_DIR] [STEPS] [ROUNDS] [DATA]
set -euo pipefail
build=${1:-build/release}
steps=${2:-8}
rounds=${3:-3}
data=${4:-${STRATA_BENCH_DATA:-}}  # a text corpus (e.g. tinyshakespeare.txt); else the built-in one
strata="$build/tools/strata"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-spill.XXXXXX")
trap 'rm -rf "$work"' EXIT
model=(--layers 6 --d-model 384 --seq-len 128 --batch 4 --device-mem 24M --lr 1e-3)
[[ -n "$data" ]] && model+=(--data "$data")

# The minimum: what a 1 MiB budget's refusal names ("need at least N bytes").
minimum() {
  rm -rf "$work/min" && mkdir -p "$work/min"
  "$strata" train "${model[@]}" --steps 1 --host-mem 1M --nvme "$work/min" "$@" 2>&1 |
    sed -n 's/.*need at least [^(]*(\([0-9]*\) bytes).*/\1/p' | head -1 || true
}
echo "# ${model[*]}"
printf "%-13s %-30s %14s\n" "micro-batches" "variant" "host_min_MiB"
declare -A mins
for mb in 1 4; do
  for v in "clip0:--grad-clip 0" "held:--grad-clip 1 --grad-spill off" "nvme:--grad-clip 1 --grad-spill on"; do
    name=${v%%:*}
    # shellcheck disable=SC2086
    m=$(minimum --micro-batches "$mb" ${v#*:})
    mins[$mb-$name]=$m
    printf "%-13s %-30s %14.1f\n" "$mb" "$name (${v#*:})" "$(echo "$m / 1048576" | bc -l)"
  done
done

run() {  # name budget flags...
  local name=$1 budget=$2
  shift 2
  local d="$work/$name"
  rm -rf "$d" && mkdir -p "$d"
  "$strata" train "${model[@]}" --steps "$steps" --host-mem "$budget" --nvme "$d" \
    --json "$d.json" --log-every 1000 "$@" >"$d.out" 2>&1 || { tail -3 "$d.out"; exit 1; }
}
held=$((${mins[1-held]} + 4096))
low=$((${mins[1-nvme]} + 4096))
for ((r = 0; r < rounds; ++r)); do
  run "held-$r" "$held" --grad-clip 1 --grad-spill off
  run "nvme-$r" "$low" --grad-clip 1 --grad-spill on
  run "clip0-$r" "$low" --grad-clip 0
  echo "# round $r done" >&2
done
python3 - "$work" "$rounds" "$held" "$low" <<'PY'
import json, statistics, sys
work, rounds, held, low = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print("%-7s %11s %9s %-22s %6s %10s %10s %7s" % ("variant", "host_MiB", "s/step", "per round",
      "eff", "rd_MiB/st", "wr_MiB/st", "redone"))
for v, budget in (("held", held), ("nvme", low), ("clip0", low)):
    rs = []
    for r in range(rounds):
        j = json.load(open(f"{work}/{v}-{r}.json"))
        st = j["steps"][2:]
        rs.append(dict(sec=statistics.median(s["seconds"] for s in st),
                       eff=statistics.median(s["efficiency"] for s in st),
                       rd=statistics.median(s["bytes"]["nvme_read"] for s in st) / 2**20,
                       wr=statistics.median(s["bytes"]["nvme_write"] for s in st) / 2**20,
                       redone=sum(1 for s in j["steps"] if s["redone_blocks"] > 0)))
    print("%-7s %11.1f %9.3f %-22s %6.2f %10.1f %10.1f %7d" % (
        v, budget / 2**20, statistics.median(x["sec"] for x in rs),
        " ".join("%.3f" % x["sec"] for x in rs), statistics.median(x["eff"] for x in rs),
        statistics.median(x["rd"] for x in rs), statistics.median(x["wr"] for x in rs),
        rs[0]["redone"]))
PY
