#!/usr/bin/env bash
# Multi-rank step benchmark: 1 rank vs 2 ranks (ZeRO-3 over Gloo on loopback) of
# the same synthetic step, alternating per round; per-rank step time and efficiency
# (median of steps 2..N of each run), and how much of each rank's all-gathers ran under
# compute (bench/trace_overlap.py on the 2-rank traces).
#   bench/multirank_step.sh STRATA_BIN ROUNDS [extra bench-step flags]
# e.g. `--collective-memory host` or `device` (the default on CPU) to compare where the
# gathers and reduce-scatters run.
set -euo pipefail
S=${1:?strata binary}; ROUNDS=${2:-3}; shift 2 || true
DIR=$(mktemp -d /var/tmp/strata-mr-bench-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
# --grad-clip 0: as recorded in PERFORMANCE.md (bench step's default before it took train's 1).
FLAGS=(--blocks 8 --block-bytes 4M --compute-ms 20 --device-mem 16M --steps 4 --threads 1 --grad-clip 0 --json - "$@")
echo "# strata bench step ${FLAGS[*]}   (1 rank, then: strata launch -n 2 -- ... --trace DIR/t.{rank}.json)"
summ() {  # json file -> per rank: median step s, median efficiency, median comm busy s, comm MiB/step
  python3 - "$1" <<'PY'
import json, statistics, sys
j = json.load(open(sys.argv[1]))
steps = j["steps"][1:]
ranks = steps[0].get("ranks") or [{"rank": 0}]
for r in range(len(ranks)):
    rows = [(s["ranks"][r] if "ranks" in s else {"seconds": s["seconds"], "efficiency": s["efficiency"],
             "comm_busy_seconds": s["busy_seconds"]["comm"], "comm_bytes": s["bytes"]["comm"]}) for s in steps]
    med = lambda k: statistics.median(x[k] for x in rows)
    print("rank %d: step_s %.3f  efficiency %.3f  comm_busy_s %.3f  comm_MiB %.1f" %
          (r, med("seconds"), med("efficiency"), med("comm_busy_seconds"), med("comm_bytes") / 2**20))
print("rank 0: h2d_MiB %.1f  d2h_MiB %.1f  per step; collective memory %s" %
      (statistics.median(s["bytes"]["h2d"] for s in steps) / 2**20,
       statistics.median(s["bytes"]["d2h"] for s in steps) / 2**20,
       j.get("config", {}).get("collective_memory", "?")))
PY
}
for ((i = 1; i <= ROUNDS; i++)); do
  echo "## round $i ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
  "$S" bench step "${FLAGS[@]}" > "$DIR/one.json"
  echo -n "1 rank  "; summ "$DIR/one.json"
  "$S" launch -n 2 -- "$S" bench step "${FLAGS[@]}" --trace "$DIR/t.{rank}.json" \
    | grep '^\[rank 0\]' | sed 's/^\[rank 0\] //' | sed -n '/^{/,$p' > "$DIR/two.json"
  summ "$DIR/two.json" | sed 's/^/2 ranks /'
  python3 "$(dirname "$0")/trace_overlap.py" "$DIR/t.0.json" "$DIR/t.1.json"
done
