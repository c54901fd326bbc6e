#!/usr/bin/env bash
# The int8 AdamW kernel against its streaming bound, beside two references, in one run
# (bench/PERFORMANCE.md, "int8 Adam moments, kernel"; issue 42). Per round:
#   - int8 moments, PARAMS parameters (from DRAM), one thread: the kernel's G params/s and its
#     ratio to its own streaming bound (the traffic kernel: the same bytes, no arithmetic);
#   - the fp32-state kernel on 16 Ki parameters (448 KiB, in L2), one thread: the AdamW
#     formula without any quantization, as the project's kernel computes it;
#   - bench/divider_floor: the divider's throughput for the int8 kernel's square root and IEEE
#     division per element (its folded formula, include/strata/optim.h). No kernel that
#     computes the formula can be faster, so divider_x_bound is the highest ratio the int8
#     kernel could reach here (the floor).
#
# Usage: bench/int8_kernel_floor.sh [BUILD_DIR] [ROUNDS] [PARAMS]   (defaults: build/release 5 4M)
set -euo pipefail
build=${1:-build/release}
rounds=${2:-5}
params=${3:-4M}
strata="$build/tools/strata"
divider="$build/bench/divider_floor"
[[ -x "$strata" ]] || { echo "int8_kernel_floor.sh: no $strata: build first" >&2; exit 2; }
[[ -x "$divider" ]] || { echo "int8_kernel_floor.sh: no $divider: build first" >&2; exit 2; }
echo "# $strata bench adam --params $params --state-dtype int8 --threads 1 --iters 10 --warmup 2"
echo "# $strata bench adam --params 16K --state-dtype fp32 --threads 1 --iters 400 --warmup 40"
echo "# $divider 0.5"
echo "round  int8_Gparam/s  int8_bound_Gparam/s  int8_ratio  fp32_L2_Gparam/s  fp32_L2_x_bound" \
  " divider_Gparam/s  divider_x_bound"
for round in $(seq 1 "$rounds"); do
  a=$("$strata" bench adam --params "$params" --state-dtype int8 --threads 1 --iters 10 --warmup 2 \
    --json - 2>/dev/null)
  b=$("$strata" bench adam --params 16K --state-dtype fp32 --threads 1 --iters 400 --warmup 40 \
    --json - 2>/dev/null)
  c=$("$divider" 0.5)
  python3 - "$round" "$a" "$b" "$c" <<'PY'
import json, sys
a = json.loads(sys.argv[2])["runs"][0]
b = json.loads(sys.argv[3])["runs"][0]
c = json.loads(sys.argv[4])
bound = a["gparams_per_s"] / a["ratio_to_bound"]
print(f"{sys.argv[1]:>5}  {a['gparams_per_s']:13.3f}  {bound:19.3f}  {a['ratio_to_bound']:10.3f}"
      f"  {b['gparams_per_s']:16.3f}  {b['gparams_per_s'] / bound:15.3f}"
      f"  {c['folded_gelements_per_s']:16.3f}  {c['folded_gelements_per_s'] / bound:15.3f}")
PY
done
