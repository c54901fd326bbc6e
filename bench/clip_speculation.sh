#!/usr/bin/env bash
# Clipping on vs off with the speculative optimizer (`strata train --speculate`,
# bench/PERFORMANCE.md "Clipping: speculative updates"): the issue's 12 x 768 case (seq 128,
# batch 4, --device-mem 256M --host-mem 1G, states on NVMe), in these variants, run in turn
# (round-robin, ROUNDS rounds, so every variant sees the same machine drift):
#   clip0        --grad-clip 0                      (no clipping: the bound to meet)
#   clip-rare    --grad-clip 100                    (clipping on, never triggers: speculates)
#   rare-wait    --grad-clip 100 --speculate off    (the same, every update waits: before)
#   default      default flags (--grad-clip 1.0, --speculate auto; from a fresh init the
#                norm exceeds 1 on most early steps, so auto mostly waits)
#   every-on     --grad-clip 1e-3 --speculate on    (clips every step: every step redone)
# Per run: the median over steps 3..N of s/step, efficiency, tail share; the table gives the
# median over the rounds, the ratio to clip0 of the same round (median of the ratios), and
# the redone steps.
#
# Usage: bench/clip_speculation.sh [BUILD_DIR] [STEPS] [ROUNDS] [DATA] [-- extra train flags]
set -euo pipefail
build=${1:-build/release}
steps=${2:-8}
rounds=${3:-3}
data=${4:-${STRATA_BENCH_DATA:-}}  # a text corpus (e.g. tinyshakespeare.txt); else the built-in one
shift $(($# < 4 ? $# : 4))
[[ "${1:-}" == "--" ]] && shift
extra=("$@")
strata="$build/tools/strata"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-clip.XXXXXX")
trap 'rm -rf "$work"' EXIT
base=(--layers 12 --d-model 768 --seq-len 128 --batch 4 --steps "$steps" --device-mem 256M
  --host-mem 1G --lr 1e-4 --log-every 1000)
[[ -n "$data" ]] && base+=(--data "$data")
base+=("${extra[@]}")
declare -A variant=(
  [clip0]="--grad-clip 0"
  [clip-rare]="--grad-clip 100"
  [rare-wait]="--grad-clip 100 --speculate off"
  [default]=""
  [every-on]="--grad-clip 1e-3 --speculate on"
)
order=(clip0 clip-rare rare-wait default every-on)
echo "# ${base[*]}"
for ((r = 0; r < rounds; ++r)); do
  for v in "${order[@]}"; do
    d="$work/$v-$r"
    mkdir -p "$d"
    # shellcheck disable=SC2086
    "$strata" train "${base[@]}" ${variant[$v]} --nvme "$d" --json "$d.json" >"$d.out" 2>&1 ||
      { echo "$v round $r failed:"; tail -5 "$d.out"; exit 1; }
    rm -rf "$d"
    echo "# round $r $v done" >&2
  done
done
python3 - "$work" "$rounds" "${order[@]}" <<'PY'
import json, statistics, sys
work, rounds, order = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def run(v, r):
    j = json.load(open(f"{work}/{v}-{r}.json"))
    st = j["steps"][2:]
    sec = statistics.median(s["seconds"] for s in st)
    return dict(sec=sec,
                eff=statistics.median(s["efficiency"] for s in st),
                tail=statistics.median(s["tail_seconds"] / s["seconds"] for s in st),
                redone=sum(1 for s in j["steps"] if s["redone_blocks"] > 0),
                spec=sum(1 for s in j["steps"] if s.get("speculative")))
res = {v: [run(v, r) for r in range(rounds)] for v in order}
print("%-11s %9s %-26s %6s %6s %8s %7s %9s" % ("variant", "s/step", "per round", "eff", "tail",
      "vs_clip0", "redone", "spec"))
for v in order:
    rs = res[v]
    ratio = statistics.median(rs[i]["sec"] / res["clip0"][i]["sec"] for i in range(rounds))
    print("%-11s %9.3f %-26s %6.2f %5.0f%% %8.3f %7d %9d" % (
        v, statistics.median(x["sec"] for x in rs), " ".join("%.3f" % x["sec"] for x in rs),
        statistics.median(x["eff"] for x in rs), 100 * statistics.median(x["tail"] for x in rs),
        ratio, rs[0]["redone"], rs[0]["spec"]))
PY
