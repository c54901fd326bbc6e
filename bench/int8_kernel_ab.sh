#!/usr/bin/env bash
# Two strata binaries' int8 AdamW kernels against their streaming bound, alternating round by
# round (bench/PERFORMANCE.md, "int8 Adam moments, kernel"; issue 42). The VM's DRAM speed
# drifts by 1.5-2 x within minutes, so only figures taken side by side compare. Per round and
# binary: `bench adam --state-dtype int8` (G params/s, the bound in G params/s, the ratio);
# then each binary's medians over the rounds.
#
# Usage: bench/int8_kernel_ab.sh OLD_STRATA NEW_STRATA [ROUNDS] [PARAMS] [THREADS]
#   (defaults: 5 rounds, 16M params: from DRAM, 2 threads: both cores of the 2-vCPU VM)
#   e.g. git worktree add /tmp/old REV && (cd /tmp/old && cmake --preset release &&
#        cmake --build --preset release --target strata); bench/int8_kernel_ab.sh
#        /tmp/old/build/release/tools/strata build/release/tools/strata 7
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
old=$1
new=$2
rounds=${3:-5}
params=${4:-16M}
threads=${5:-2}
for bin in "$old" "$new"; do
  [[ -x "$bin" ]] || { echo "int8_kernel_ab.sh: no executable $bin: build it first" >&2; exit 2; }
done
echo "# BIN bench adam --params $params --state-dtype int8 --threads $threads --iters 10 --warmup 2"
echo "round  binary  Gparam/s  bound_Gparam/s  ratio"
results=()
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$old
    [[ $which == new ]] && bin=$new
    json=$("$bin" bench adam --params "$params" --state-dtype int8 --threads "$threads" \
      --iters 10 --warmup 2 --json - 2>/dev/null)
    line=$(python3 - "$round" "$which" "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[3])["runs"][0]
if r["wrong"]:
    sys.exit(f"int8_kernel_ab.sh: {r['wrong']} wrong values from {sys.argv[2]}")
bound = r["gparams_per_s"] / r["ratio_to_bound"]
print(f"{sys.argv[1]:>5}  {sys.argv[2]:>6}  {r['gparams_per_s']:8.3f}  {bound:14.3f}"
      f"  {r['ratio_to_bound']:5.3f}")
PY
)
    echo "$line"
    results+=("$line")
  done
done
printf '%s\n' "${results[@]}" | python3 -c '
import statistics, sys
rows = [line.split() for line in sys.stdin if line.strip()]
for which in ("old", "new"):
    g = [float(r[2]) for r in rows if r[1] == which]
    q = [float(r[4]) for r in rows if r[1] == which]
    print(f"median {which}: {statistics.median(g):.3f} G params/s, ratio {statistics.median(q):.3f}")
'
