#!/usr/bin/env bash
# `strata verify` and `strata export` of a 2-rank store against what the drive allows, in the
# same run (issue 43's targets): fio's sequential O_DIRECT read of the store's own rank files
# (1 MiB, qd 32, io_uring), and, for export (which reads the store and writes the same bytes
# again on the same drive), a plain copy of those files to one output file on the same folder
# (`cat` through the page cache, then fsync: the bytes a one-disk export must move, with no
# format work). Runs alternate (fio, verify, copy, export) so drift hits all alike; medians of
# ROUNDS. Export's peak RSS comes from /usr/bin/time -v. verify's rate is its read time as it
# reports it (--json read.seconds: every rank's extents read and checksummed), as fio's is its
# I/O time; verify_cmd_s is the whole command (with the process start, which in a CUDA build
# loads the CUDA libraries, and the record and manifest checks).
#
# Usage: bench/export_verify.sh [DIR] [ROUNDS] [MODEL]
#   DIR     a folder on the drive (default: a fresh folder under /var/tmp), removed at the end
#   ROUNDS  default 3
#   MODEL   train's --layers/--d-model/--heads, default "36 1280 20" (GPT-2 large)
#   STRATA=path/to/strata picks the binary (default build/release/tools/strata)
# The store is the run's initial commit (train --steps 0 on 2 ranks: fp32 master, no moments
# yet), written once before the rounds.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
strata=${STRATA:-$here/build/release/tools/strata}
dir=${1:-$(mktemp -d /var/tmp/strata_export_bench.XXXXXX)}
rounds=${2:-3}
read -r layers dmodel heads <<<"${3:-36 1280 20}"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
for tool in fio /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "export_verify.sh: $tool is missing" >&2; exit 1; }
done

echo "# store: $layers x $dmodel, 2 ranks, initial commit, in $dir"
"$strata" launch -n 2 -- "$strata" train --layers "$layers" --d-model "$dmodel" \
  --heads "$heads" --steps 0 --host-mem 2G --nvme "$dir/{rank}" >"$dir/train.log" 2>&1 ||
  { cat "$dir/train.log" >&2; exit 1; }
# the committed extents of each rank file (a store file is preallocated beyond them: fio must
# read written bytes, never unwritten extents that the file system returns as zeros; whole
# MiB, its block)
layout=$("$strata" verify "$dir/{rank}" --json - 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
for r in j["ranks"]:
    for f in r["folders"]:
        print(f["data_file"], f["committed_bytes_starting_here"])')
bytes=$(awk '{s += $2} END {printf "%.0f", s}' <<<"$layout")
files=$(awk '{print $1}' <<<"$layout")
echo "# store files: $(wc -l <<<"$layout"), $bytes committed bytes"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
fio_read() {
  local args=() f n
  while read -r f n; do
    args+=(--name="r$f" --filename="$f" --size="$(( n / 1048576 * 1048576 ))")
  done <<<"$layout"
  fio --ioengine=io_uring --direct=1 --rw=read --bs=1M --iodepth=32 --fixedbufs \
    --registerfiles --output-format=json --group_reporting "${args[@]}" |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["jobs"][0]["read"]["bw_bytes"])'
}
copy() {  # each file's committed bytes
  local f n
  while read -r f n; do head -c "$n" "$f"; done <<<"$layout" >"$dir/copy.bin"
  sync "$dir/copy.bin" && rm -f "$dir/copy.bin"
}
export_once() {
  rm -f "$dir/out.safetensors"
  /usr/bin/time -v "$strata" export "$dir/{rank}" --out "$dir/out.safetensors" 2>"$dir/time.txt" \
    >/dev/null
  sync "$dir/out.safetensors"
}
verify_read() {  # verify's own read time (its --json), as fio's bandwidth is its I/O time's
  "$strata" verify "$dir/{rank}" --json "$dir/verify.json" >/dev/null 2>&1
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["read"]["seconds"])' \
    "$dir/verify.json"
}
printf '%-5s %12s %12s %12s %12s %10s %10s %10s %12s %12s\n' round fio_MBps verify_MBps copy_MBps \
  export_MBps verify/fio export/fio export/copy export_RSS_MiB verify_cmd_s
for r in $(seq "$rounds"); do
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  f=$(fio_read)
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  t0=$(date +%s.%N); v=$(verify_read); vc=$(echo "$(date +%s.%N) - $t0" | bc -l)
  c=$(secs copy)
  t0=$(date +%s.%N); export_once; e=$(echo "$(date +%s.%N) - $t0" | bc -l)
  rss=$(awk '/Maximum resident/ {print $6 / 1024}' "$dir/time.txt")
  rm -f "$dir/out.safetensors"
  awk -v r="$r" -v b="$bytes" -v f="$f" -v v="$v" -v c="$c" -v e="$e" -v rss="$rss" -v vc="$vc" \
    'BEGIN { printf "%-5s %12.1f %12.1f %12.1f %12.1f %10.3f %10.3f %10.3f %12.1f %12.2f\n", r,
      f / 1e6, b / v / 1e6, b / c / 1e6, b / e / 1e6, (b / v) / f, (b / e) / f, c / e, rss, vc }'
done | tee "$dir/rows.txt"
for col in 6 7 8 9; do
  printf 'median %s: %s\n' "$(head -1 <<<'x x x x x verify/fio export/fio export/copy export_RSS_MiB' | cut -d' ' -f$col)" \
    "$(awk -v c="$col" '{print $c}' "$dir/rows.txt" | median)"
done
