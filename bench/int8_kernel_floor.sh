#!/usr/bin/env bash
# The int8 AdamW kernel against its streaming bound, and the floor of its arithmetic, in one run
# (bench/PERFORMANCE.md, "int8 Adam moments, kernel"; issue 42). Per round:
#   - int8 moments, PARAMS parameters (from DRAM), one thread: the kernel's G params/s and its
#     ratio to its own streaming bound (the traffic kernel: the same bytes, no arithmetic);
#   - the fp32-state kernel on 16 Ki parameters (448 KiB: in L2, no DRAM traffic), one thread:
#     the AdamW formula's arithmetic alone (two IEEE divisions and a square root per element, the
#     operations the int8 kernel shares with it on every ISA), without any quantization.
# The int8 kernel does all of the second's arithmetic and more, so floor = fp32-in-L2 G params/s /
# int8-bound G params/s is the highest ratio any kernel with this formula can reach here.
#
# Usage: bench/int8_kernel_floor.sh [BUILD_DIR] [ROUNDS] [PARAMS]   (defaults: build/release 5 4M)
set -euo pipefail
build=${1:-build/release}
rounds=${2:-5}
params=${3:-4M}
strata="$build/tools/strata"
[[ -x "$strata" ]] || { echo "int8_kernel_floor.sh: no $strata: build first" >&2; exit 2; }
echo "# $strata bench adam --params $params --state-dtype int8 --threads 1 --iters 10 --warmup 2"
echo "# $strata bench adam --params 16K --state-dtype fp32 --threads 1 --iters 400 --warmup 40"
echo "round  int8_Gparam/s  int8_bound_Gparam/s  int8_ratio  fp32_L2_Gparam/s  floor"
for round in $(seq 1 "$rounds"); do
  a=$("$strata" bench adam --params "$params" --state-dtype int8 --threads 1 --iters 10 --warmup 2 \
    --json - 2>/dev/null)
  b=$("$strata" bench adam --params 16K --state-dtype fp32 --threads 1 --iters 400 --warmup 40 \
    --json - 2>/dev/null)
  python3 - "$round" "$a" "$b" <<'EOF'
import json, sys
a = json.loads(sys.argv[2])["runs"][0]
b = json.loads(sys.argv[3])["runs"][0]
bound = a["gparams_per_s"] / a["ratio_to_bound"]
print(f"{sys.argv[1]:>5}  {a['gparams_per_s']:13.3f}  {bound:19.3f}  {a['ratio_to_bound']:10.3f}"
      f"  {b['gparams_per_s']:16.3f}  {b['gparams_per_s'] / bound:5.3f}")
EOF
done
