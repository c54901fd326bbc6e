#!/usr/bin/env bash
# Two strata binaries' step times side by side (bench/PERFORMANCE.md, "Before/after"; issue 45's
# "no change in the benchmarks' step times"): `bench step` compute-bound and the demo, the two
# binaries alternating, ROUNDS rounds. Prints per round and binary the median step of bench step
# (steps 2-4) and of the demo (steps 2-300) with their efficiencies, then the medians over
# rounds and new / old.
#
# Usage: bench/before_after.sh OLD_STRATA NEW_STRATA [ROUNDS]
#   e.g. git worktree add /tmp/old REV && (cd /tmp/old && cmake --preset release &&
#        cmake --build --preset release --target strata); bench/before_after.sh
#        /tmp/old/build/release/tools/strata build/release/tools/strata 3
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n "2,12p" "$0"; exit 2; }
old=$1
new=$2
rounds=${3:-3}
for b in "$old" "$new"; do
  [[ -x "$b" ]] || { echo "before_after.sh: $b is not an executable strata binary" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-before-after.XXXXXX")
trap 'rm -rf "$work"' EXIT
step=(bench step --blocks 16 --block-bytes 16M --steps 4 --threads 1 --grad-clip 0 --compute-ms 40
  --device-mem 64M --host-mem 256M)
demo=(train --steps 300 --lr 3e-3 --lr-schedule cosine --warmup 20 --device-mem 3M --host-mem 8M
  --val-every 100 --sample 160)
echo "# STRATA ${step[*]} --nvme DIR/swap --json -"
echo "# STRATA ${demo[*]} --nvme DIR --json DIR/run.json"
results="$work/results.tsv"
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$old
    [[ "$which" == new ]] && bin=$new
    rm -rf "$work/swap" "$work/demo"
    "$bin" "${step[@]}" --nvme "$work/swap" --json - >"$work/step.json" 2>/dev/null
    "$bin" "${demo[@]}" --nvme "$work/demo" --json "$work/run.json" >/dev/null 2>&1
    python3 - "$round" "$which" "$work/step.json" "$work/run.json" >>"$results" <<'EOF'
import json, statistics, sys
def steps(d):
    return d["steps"] if "steps" in d else d["runs"][0]["steps"]
def med(xs):
    return statistics.median(xs)
bench = steps(json.load(open(sys.argv[3])))[1:]
demo = steps(json.load(open(sys.argv[4])))[1:]
print("\t".join([sys.argv[1], sys.argv[2],
                 f"{med([s['seconds'] for s in bench]):.4f}",
                 f"{med([s['efficiency'] for s in bench]):.3f}",
                 f"{med([s['seconds'] for s in demo]):.5f}",
                 f"{med([s['efficiency'] for s in demo]):.3f}"]))
EOF
  done
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
print("round  binary  bench_step_s  eff    demo_s    eff")
for r in rows:
    print(f"{r[0]:>5}  {r[1]:<6}  {r[2]:>12}  {r[3]}  {r[4]}  {r[5]}")
m = {w: [statistics.median(float(r[c]) for r in rows if r[1] == w) for c in (2, 4)]
     for w in ("old", "new")}
print(f"medians: bench step {m['old'][0]:.4f} -> {m['new'][0]:.4f} s (new/old "
      f"{m['new'][0] / m['old'][0]:.3f}); demo {m['old'][1]:.5f} -> {m['new'][1]:.5f} s/step "
      f"(new/old {m['new'][1] / m['old'][1]:.3f})")
EOF
