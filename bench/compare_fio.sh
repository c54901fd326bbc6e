#!/usr/bin/env bash
# Side by side on the same file system: `strata bench io` against fio (io_uring engine),
# and Strata's PosixBackend against its io_uring backend. 1 MiB blocks, queue depth 32,
# O_DIRECT, sequential read and write; runs alternate (strata, fio, posix, strata, ...)
# so drift on a shared machine hits every contender alike; medians of ROUNDS runs.
#
# Usage: bench/compare_fio.sh [DIR] [SIZE] [ROUNDS]
#   DIR    folder on the drive to measure (default: a fresh folder under /var/tmp)
#   SIZE   bytes per pass, fio/strata syntax (default 1G)
#   ROUNDS runs per contender (default 5)
#   STRATA=path/to/strata overrides the binary (default build/release/tools/strata, then
#   any build/*/tools/strata).
#
# The files are in the same state for both tools, and each read run follows the same
# sequence: a fresh file (fallocated by strata, by fio's write job for fio) is written
# with O_DIRECT 1 MiB writes at qd 32 and fsynced, read once unmeasured (strata --warmup
# 1; fio a --loops=1 run), then read twice measured. So both read written data (never
# unwritten fallocated extents, which ext4 returns as zeros without touching the drive),
# with the same extent layout (checked with filefrag). Writes overwrite already-written
# extents (strata: after one unmeasured warm-up pass; fio: the file its read run left).
# Each measurement moves 2 passes of SIZE; reads and writes are separate runs with a pause
# (SETTLE seconds, default 1) after each, so a read never competes with the flushing of
# the previous run's writes. fio gets registered buffers and files too, so both sides use
# the same kernel features.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
strata=${STRATA:-}
if [[ -z "$strata" ]]; then
  for c in "$here/build/release/tools/strata" "$here"/build/*/tools/strata; do
    [[ -x "$c" ]] && strata=$c && break
  done
fi
[[ -x "$strata" ]] || { echo "compare_fio.sh: no strata binary; build it or set STRATA=" >&2; exit 1; }
command -v fio >/dev/null || { echo "compare_fio.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }

own_dir=0
dir=${1:-}
if [[ -z "$dir" ]]; then
  dir=$(mktemp -d /var/tmp/strata_compare_fio.XXXXXX)
  own_dir=1
fi
size=${2:-1G}
rounds=${3:-5}
bs=1M
qd=32
cleanup() {
  rm -f "$dir/fio.dat"
  if [[ $own_dir == 1 ]]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

strata_cmd() {  # backend mode
  echo "$strata bench io --path $dir --size $size --block $bs --qd $qd --mode $2" \
       "--backend $1 --direct --iters 2 --warmup 1 --json -"
}
fio_cmd() {  # rw
  echo "fio --name=cmp --filename=$dir/fio.dat --size=$size --bs=$bs --iodepth=$qd --rw=$1" \
       "--direct=1 --ioengine=io_uring --fixedbufs=1 --registerfiles=1 --loops=2" \
       "--output-format=json"
}

# strata JSON -> GB/s (fails the script when a run reports #wrong > 0)
parse_strata() {
  python3 -c '
import json, sys
r = json.load(sys.stdin)["runs"][0]
if r["wrong"]:
    sys.exit("strata bench io reported %d wrong blocks" % r["wrong"])
print(r["MBps"] / 1e3)'
}
# Lets the drive (and on a VM the host's cache) finish the previous run's writes, so that
# no contender reads while another's writes are still being flushed.
settle() { sync; sleep "${SETTLE:-1}"; }
parse_fio() {  # rw
  python3 -c '
import json, sys
d = json.load(sys.stdin)
j = d["jobs"][0]
side = "write" if sys.argv[1] == "write" else "read"
print(j[side]["bw_bytes"] / 1e9)' "$1"
}

echo "# compare_fio.sh: $(date -u +%FT%TZ) on $(uname -r), $(nproc) cores"
echo "# folder: $dir ($(stat -f -c %T "$dir")); size per pass $size; block $bs; qd $qd; O_DIRECT; $rounds rounds"
echo "# strata: $(strata_cmd uring read) (then --mode write)"
echo "# fio:    $(fio_cmd read) (then --rw=write); its read file laid out by $(fio_cmd write) --loops=1 --fsync_on_close=1, then one unmeasured --loops=1 read"
echo "# posix:  $(strata_cmd posix read) (then --mode write)"

sw=() sr=() fw=() fr=() pw=() pr=()
for ((i = 1; i <= rounds; i++)); do
  # Each contender reads a fresh file it has just laid out, then (separately) overwrites.
  sr+=("$($(strata_cmd uring read) | parse_strata)"); settle
  sw+=("$($(strata_cmd uring write) | parse_strata)"); settle
  rm -f "$dir/fio.dat"
  # Lay the file out as strata does (O_DIRECT writes at qd 32, then fsync), then the
  # unmeasured warm-up read pass.
  $(fio_cmd write) --loops=1 --fsync_on_close=1 >/dev/null
  $(fio_cmd read) --loops=1 >/dev/null
  fr+=("$($(fio_cmd read) | parse_fio read)"); settle
  fw+=("$($(fio_cmd write) | parse_fio write)"); settle
  pr+=("$($(strata_cmd posix read) | parse_strata)"); settle
  pw+=("$($(strata_cmd posix write) | parse_strata)"); settle
  printf '# round %d: strata w %.3f r %.3f | fio w %.3f r %.3f | posix w %.3f r %.3f GB/s\n' \
    "$i" "${sw[-1]}" "${sr[-1]}" "${fw[-1]}" "${fr[-1]}" "${pw[-1]}" "${pr[-1]}"
done

python3 - "${sw[*]}" "${sr[*]}" "${fw[*]}" "${fr[*]}" "${pw[*]}" "${pr[*]}" <<'PY'
import statistics, sys
sw, sr, fw, fr, pw, pr = ([float(x) for x in a.split()] for a in sys.argv[1:7])
m = statistics.median
# Two figures per comparison: the ratio of the medians, and the median of the per-round
# ratios (each round's contenders ran back to back, so this one cancels slow drift of a
# shared machine best). The target is judged on the paired figure.
rows = [
    ("write", "strata(io_uring) / fio(io_uring)", sw, fw, 0.95),
    ("read",  "strata(io_uring) / fio(io_uring)", sr, fr, 0.95),
    ("write", "strata posix / strata io_uring",   pw, sw, 0.80),
    ("read",  "strata posix / strata io_uring",   pr, sr, 0.80),
]
print("%-6s %-34s %9s %9s %13s %12s %7s %s" % ("#mode", "comparison", "GB/s", "peer GB/s",
      "ratio(median)", "ratio(pairs)", "target", "met"))
ok = True
for mode, what, a, b, target in rows:
    ratio = m(a) / m(b) if m(b) else 0.0
    paired = m([x / y for x, y in zip(a, b) if y])
    met = paired >= target
    ok &= met
    print("%-6s %-34s %9.3f %9.3f %13.3f %12.3f %7.2f %s" % (mode, what, m(a), m(b), ratio,
          paired, target, "yes" if met else "NO"))
sys.exit(0 if ok else 2)
PY
