#!/usr/bin/env bash
# The module boundaries, checked: every #include "folder/file.h" in a module must name a
# folder that module may depend on, so one module cannot reach into another's internals.
#
#   include/strata   the public API: only itself, and none of CUDA, liburing, oneTBB, NCCL or
#                    Gloo (it must compile without them)
#   io cpu_optim gpu the bottom modules: only the public API and themselves
#   comm             the public API, itself, and gpu/ (NCCL runs on the CUDA device)
#   engine           the public API, itself, io/'s module interface (SwapStore, PinnedPool,
#                    RangeAllocator) and comm/rank_groups.h (header-only: how a difference
#                    between ranks is worded)
#   model            the public API and itself (the GPT-2 workload is written against the public
#                    API, as outside code would be)
#   trainer          the public API, model/, and comm/'s module interface (join.h, messages.h)
#   tools            the public API, model/, trainer/, comm/'s module interface (with
#                    run_secret.h for strata launch) and itself
#   bench            the public API, model/ and itself
#   python           the public API and itself (the binding is libstrata's public API only)
# Tests may include anything. Usage: include_rules_test.sh [REPO_ROOT]; exit 1 on a violation,
# each printed as file:line and the rule it breaks.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

allowed() {  # allowed MODULE INCLUDE_PATH
  local m=$1 inc=$2 dir=${2%%/*}
  case "$m" in
    include) [ "$dir" = strata ] ;;
    io|cpu_optim|gpu) [ "$dir" = strata ] || [ "$dir" = "$m" ] ;;
    comm) [ "$dir" = strata ] || [ "$dir" = comm ] || [ "$dir" = gpu ] ;;
    engine)
      [ "$dir" = strata ] || [ "$dir" = engine ] ||
        [[ "$inc" =~ ^io/(swap_store|pinned_pool|range_allocator)\.h$ ]] ||
        [ "$inc" = comm/rank_groups.h ] ;;
    model) [ "$dir" = strata ] || [ "$dir" = model ] ;;
    trainer)
      [ "$dir" = strata ] || [ "$dir" = model ] || [ "$dir" = trainer ] ||
        [[ "$inc" =~ ^comm/(join|messages)\.h$ ]] ;;
    tools)
      [ "$dir" = strata ] || [ "$dir" = model ] || [ "$dir" = trainer ] || [ "$dir" = tools ] ||
        [[ "$inc" =~ ^comm/(join|messages|run_secret)\.h$ ]] ;;
    bench) [ "$dir" = strata ] || [ "$dir" = model ] || [ "$dir" = bench ] ;;
    python) [ "$dir" = strata ] || [ "$dir" = python ] ;;
    *) return 0 ;;
  esac
}

bad=0
for m in include io cpu_optim gpu comm engine model trainer tools bench python; do
  [ -d "$m" ] || continue
  while IFS=: read -r file line text; do
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$text")
    [[ "$inc" == */* ]] || continue  # same-folder includes
    if ! allowed "$m" "$inc"; then
      echo "$file:$line: $m/ may not include \"$inc\" (see the rules at the top of $0)"
      bad=1
    fi
  done < <(grep -rnE '^#include "' "$m" --include='*.h' --include='*.cc' --include='*.cu')
done
if grep -rnE '^#include <(cuda|cublas|nccl|liburing|tbb/|oneapi/|gloo/)' include/; then
  echo "include/strata must compile without CUDA, liburing, oneTBB, NCCL and Gloo headers"
  bad=1
fi
[ $bad = 0 ] && echo "include rules: every module includes only what it may"
exit $bad
