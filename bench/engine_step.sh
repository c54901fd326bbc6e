#!/usr/bin/env bash
# The tiered engine's step benchmarks (bench/PERFORMANCE.md, "Tiered engine").
#
# Runs, ROUNDS times in alternation, on a HostDevice:
#   offloaded compute-bound : 16 blocks x 16 MiB, 40 ms/80 ms per block, device 64 MiB,
#                             host 256 MiB, master/moments partly and moments wholly on NVMe
#   in-budget compute-bound : the same model with no budgets (everything in memory)
#   offloaded I/O-bound     : the offloaded configuration with --compute-ms 0
#   fio                     : 50/50 read/write, 1 MiB blocks, QD 32, O_DIRECT, io_uring, on
#                             the same folder (what the drive gives a mixed load)
# and prints per configuration the median over rounds of each run's median step (steps 2..S;
# step 1 fills the caches), the efficiency, the ratio offloaded/in-budget and the I/O-bound
# step's NVMe rate against fio's.
#
# Usage: bench/engine_step.sh [STRATA_BINARY] [ROUNDS] [STEPS]
set -euo pipefail
STRATA=${1:-build/engine/tools/strata}
ROUNDS=${2:-3}
STEPS=${3:-4}
DIR=$(mktemp -d /var/tmp/strata-engine-bench.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
OUT="$DIR/results"
mkdir -p "$OUT"

# --grad-clip 0: these figures were recorded without clipping, bench step's default before it
# took `strata train`'s (1); with clipping the host minimum of this model is 304 MiB, over the
# 256 MiB budget below.
common=(--blocks 16 --block-bytes 16M --steps "$STEPS" --threads 1 --grad-clip 0 --json -)
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$DIR/swap" && mkdir "$DIR/swap"
  "$STRATA" bench step "${common[@]}" --compute-ms 40 --device-mem 64M --host-mem 256M \
    --nvme "$DIR/swap" > "$OUT/offload_compute.$r.json" 2> /dev/null
  "$STRATA" bench step "${common[@]}" --compute-ms 40 > "$OUT/inbudget_compute.$r.json" 2> /dev/null
  rm -rf "$DIR/swap" && mkdir "$DIR/swap"
  "$STRATA" bench step "${common[@]}" --compute-ms 0 --device-mem 64M --host-mem 256M \
    --nvme "$DIR/swap" > "$OUT/offload_io.$r.json" 2> /dev/null
  fio --name=mix --filename="$DIR/fio.dat" --size=1G --bs=1M --iodepth=32 --rw=rw \
    --rwmixread=50 --direct=1 --ioengine=io_uring --loops=2 --output-format=json \
    > "$OUT/fio.$r.json" 2> /dev/null
  rm -f "$DIR/fio.dat"
done

python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def runs(name):
    res = []
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/{name}.{r}.json"))
        steady = d["steps"][1:] or d["steps"]
        med = lambda k: statistics.median(s[k] for s in steady)
        res.append({
            "seconds": med("seconds"), "bound": med("bound_seconds"),
            "eff": med("efficiency"), "stall": med("stall_seconds"),
            "nvme_bps": statistics.median((s["bytes"]["nvme_read"] + s["bytes"]["nvme_write"]) / s["seconds"] for s in steady),
            "wrong": d["steps"][-1].get("wrong", 0), "bound_by": steady[-1]["bound_resource"]})
    return res
def m(rs, k): return statistics.median(x[k] for x in rs)
oc, ic, oi = runs("offload_compute"), runs("inbudget_compute"), runs("offload_io")
fio = []
for r in range(1, rounds + 1):
    j = json.load(open(f"{out}/fio.{r}.json"))["jobs"][0]
    fio.append((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]))
fio_bps = statistics.median(fio)
print("# config                  step_s  bound_s  effic  stall_s  nvme_GB/s  bound_by   #wrong")
for name, rs in (("offloaded compute-bound", oc), ("in-budget compute-bound", ic), ("offloaded I/O-bound", oi)):
    print(f"  {name:23s} {m(rs,'seconds'):7.3f} {m(rs,'bound'):8.3f} {m(rs,'eff'):6.3f} {m(rs,'stall'):8.3f} {m(rs,'nvme_bps')/1e9:10.3f}  {rs[-1]['bound_by']:9s} {sum(x['wrong'] for x in rs)}")
print(f"  fio 50/50 rw 1M QD32                                          {fio_bps/1e9:10.3f}")
print(f"# per round: offloaded/in-budget step ratio {[round(a['seconds']/b['seconds'],3) for a,b in zip(oc,ic)]}")
print(f"# per round: I/O-bound NVMe rate / fio {[round(a['nvme_bps']/f,3) for a,f in zip(oi,fio)]}")
print(f"# median ratio offloaded/in-budget: {statistics.median(a['seconds']/b['seconds'] for a,b in zip(oc,ic)):.3f}")
print(f"# median NVMe rate / fio: {statistics.median(a['nvme_bps']/f for a,f in zip(oi,fio)):.3f}")
EOF
