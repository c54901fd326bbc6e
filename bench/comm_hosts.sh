#!/usr/bin/env bash
# `strata bench comm` on loopback (2 and 4 ranks under one `strata launch`) and across two
# "hosts" (network namespaces joined by a veth pair, Redis in the first, one launch per
# namespace), ROUNDS runs of each, alternating; per collective and size the median over the
# runs of busbw and of busbw / the TCP bound each run measured itself (a socket copy from
# rank 0 to rank 1 on the same addresses as Gloo), and the sum of #wrong. Needs root for the
# namespaces (the 2-host part is skipped, saying so, without them) and redis-server.
#   bench/comm_hosts.sh STRATA_BIN [ROUNDS] [extra bench-comm flags]
set -euo pipefail
S=$(readlink -f "${1:?strata binary}"); ROUNDS=${2:-3}; shift 2 || true
DIR=$(mktemp -d /var/tmp/strata-comm-bench-XXXXXX)
NS0=strata-bh0-$$ NS1=strata-bh1-$$ V0=sbv0-$$ V1=sbv1-$$ A0=10.232.7.1 A1=10.232.7.2
REDIS_PID=
cleanup() {
  [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null
  ip netns del "$NS0" 2>/dev/null; ip netns del "$NS1" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
FLAGS=(--min-bytes 1K --max-bytes 16M --factor 4 --iters 10 --warmup 2 --tcp-bytes 256M "$@")
echo "# strata bench comm ${FLAGS[*]} --json FILE; $ROUNDS rounds; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

hosts=0
if ip netns add "$NS0" 2>/dev/null && ip netns add "$NS1" && ip link add "$V0" type veth peer name "$V1"; then
  for h in 0 1; do
    ns=NS$h v=V$h a=A$h
    ip link set "${!v}" netns "${!ns}"
    ip -n "${!ns}" addr add "${!a}/24" dev "${!v}"
    ip -n "${!ns}" link set "${!v}" up
    ip -n "${!ns}" link set lo up
  done
  PORT=$((20000 + $$ % 20000))
  ip netns exec "$NS0" redis-server --port $PORT --bind $A0 --save '' --appendonly no \
    --protected-mode no --logfile /dev/null & REDIS_PID=$!
  for i in $(seq 50); do
    ip netns exec "$NS1" timeout 2 redis-cli -h $A0 -p $PORT ping 2>/dev/null | grep -q PONG && { hosts=1; break; }
    sleep 0.1
  done
fi
[ $hosts = 1 ] || echo "# 2 hosts: skipped (cannot create network namespaces or start redis-server)"

for r in $(seq "$ROUNDS"); do
  for n in 2 4; do
    "$S" launch -n $n --output rank0 -- "$S" bench comm "${FLAGS[@]}" --json "$DIR/lo$n.$r.json" \
      >/dev/null 2>"$DIR/err" || { cat "$DIR/err"; exit 1; }
  done
  if [ $hosts = 1 ]; then
    pids=()
    for h in 1 0; do
      ip netns exec "${NS0/0/$h}" timeout 300 "$S" launch -n 1 --nnodes 2 --node-rank $h \
        --comm-interface "${V0/0/$h}" --rendezvous "redis://$A0:$PORT/round$r" -- \
        "$S" bench comm "${FLAGS[@]}" --json "$DIR/hosts.$r.json" >/dev/null 2>"$DIR/err$h" &
      pids+=($!)
    done
    wait "${pids[0]}" || { cat "$DIR/err1"; exit 1; }
    wait "${pids[1]}" || { cat "$DIR/err0"; exit 1; }
  fi
done

python3 - "$DIR" "$ROUNDS" $hosts <<'PY'
import json, statistics, sys
d, rounds, hosts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cases = [("lo2", "2 ranks, loopback (one launch)"), ("lo4", "4 ranks, loopback (one launch)")]
if hosts: cases.append(("hosts", "2 hosts x 1 rank, network namespaces over a veth pair (Redis rendezvous)"))
for key, title in cases:
    runs = [json.load(open(f"{d}/{key}.{r}.json")) for r in range(1, rounds + 1)]
    tcp = [j["tcp_bound_gbps"] for j in runs]
    print(f"\n{title}: TCP bound (rank 0 -> 1, one socket) per run: " + ", ".join("%.2f" % t for t in tcp) +
          " GB/s, median %.2f" % statistics.median(tcp))
    print("| collective | size | time (us) | algbw (GB/s) | busbw (GB/s) | busbw / TCP | #wrong |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, row in enumerate(runs[0]["results"]):
        rows = [j["results"][i] for j in runs]
        med = lambda k: statistics.median(x[k] for x in rows)
        ratio = statistics.median(x["busbw_gbps"] / j["tcp_bound_gbps"] for x, j in zip(rows, runs))
        size = row["bytes"]
        size_s = f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB" if size >= 1024 else f"{size} B"
        print(f"| {row['op']} | {size_s} | {med('time_us'):.0f} | {med('algbw_gbps'):.3f} | "
              f"{med('busbw_gbps'):.3f} | {ratio:.2f} | {sum(x['wrong'] for x in rows)} |")
PY
