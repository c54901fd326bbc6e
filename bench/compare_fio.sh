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
# The files are in the same state for both tools: reads run on a file created and written
# just before (strata lays out its own file; fio's file is removed so fio lays it out
# again) and writes overwrite already-written extents (strata: one unmeasured warm-up
# pass; fio: the file its read run left). Each measurement moves 2 passes of SIZE. fio gets
# registered buffers and files too, so both sides use the same kernel features.
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

strata_cmd() {  # backend
  echo "$strata bench io --path $dir --size $size --block $bs --qd $qd --mode write --mode read" \
       "--backend $1 --direct --iters 2 --warmup 1 --json"
}
fio_cmd() {  # rw
  echo "fio --name=cmp --filename=$dir/fio.dat --size=$size --bs=$bs --iodepth=$qd --rw=$1" \
       "--direct=1 --ioengine=io_uring --fixedbufs=1 --registerfiles=1 --loops=2" \
       "--output-format=json"
}

# strata JSON -> "write_gbps read_gbps" (fails the script when a run reports #wrong > 0)
parse_strata() {
  python3 -c '
import json, sys
d = json.load(sys.stdin)
bw = {}
for r in d["runs"]:
    if r["wrong"]:
        sys.exit("strata bench io reported %d wrong blocks" % r["wrong"])
    bw[r["mode"]] = r["gbps"]
print(bw["write"], bw["read"])'
}
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
echo "# strata: $(strata_cmd uring)"
echo "# fio:    $(fio_cmd read) (then --rw=write)"
echo "# posix:  $(strata_cmd posix)"

sw=() sr=() fw=() fr=() pw=() pr=()
for ((i = 1; i <= rounds; i++)); do
  read -r w r < <($(strata_cmd uring) | parse_strata); sw+=("$w"); sr+=("$r")
  rm -f "$dir/fio.dat"  # like strata's: a fresh file, laid out (written) just before the reads
  fr+=("$($(fio_cmd read) | parse_fio read)")
  fw+=("$($(fio_cmd write) | parse_fio write)")  # overwrites written extents, like strata's
  read -r w r < <($(strata_cmd posix) | parse_strata); pw+=("$w"); pr+=("$r")
  printf '# round %d: strata w %.3f r %.3f | fio w %.3f r %.3f | posix w %.3f r %.3f GB/s\n' \
    "$i" "${sw[-1]}" "${sr[-1]}" "${fw[-1]}" "${fr[-1]}" "${pw[-1]}" "${pr[-1]}"
done

python3 - "${sw[*]}" "${sr[*]}" "${fw[*]}" "${fr[*]}" "${pw[*]}" "${pr[*]}" <<'PY'
import statistics, sys
sw, sr, fw, fr, pw, pr = ([float(x) for x in a.split()] for a in sys.argv[1:7])
m = statistics.median
rows = [
    ("write", "strata(io_uring) / fio(io_uring)", m(sw), m(fw), 0.95),
    ("read",  "strata(io_uring) / fio(io_uring)", m(sr), m(fr), 0.95),
    ("write", "strata posix / strata io_uring",   m(pw), m(sw), 0.80),
    ("read",  "strata posix / strata io_uring",   m(pr), m(sr), 0.80),
]
print("%-6s %-34s %10s %10s %7s %7s %s" % ("#mode", "comparison", "GB/s", "peer GB/s",
                                          "ratio", "target", "met"))
ok = True
for mode, what, a, b, target in rows:
    ratio = a / b if b else 0.0
    met = ratio >= target
    ok &= met
    print("%-6s %-34s %10.3f %10.3f %7.3f %7.2f %s" % (mode, what, a, b, ratio, target,
                                                         "yes" if met else "NO"))
sys.exit(0 if ok else 2)
PY
