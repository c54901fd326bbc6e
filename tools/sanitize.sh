#!/usr/bin/env bash
# The suite under the sanitizers, repeatably (docs/reliability.md, "The whole suite under the
# sanitizers"):
#   tools/sanitize.sh asan          ASan + UBSan (-fno-sanitize-recover=undefined): build/asan
#   tools/sanitize.sh tsan          ThreadSanitizer (tests/tsan.supp): build/tsan
#   tools/sanitize.sh asan tsan     both, one after the other
# Options (before the presets): -j N (build and ctest jobs; default nproc), --build-only,
# --no-build (ctest on what build/<preset> holds, e.g. with -- -R for the tests built),
# --nice (build and test at nice 10: a shared machine), and after -- anything for ctest
# (e.g. -- -R Engine, -- -LE slow). CUDA is off (the sanitizers' runtimes and nvcc's
# objects do not mix); the Python binding is not built (an interpreter does not load the
# sanitizer's runtime). The GPU tests skip themselves on a machine without one.
#
# Each preset writes build/<preset>/sanitize.log (ctest's output) and every sanitizer report
# into build/<preset>/sanitizer-reports/ (log_path: a report from a forked child or a CLI
# process that a test ran does not always change the test's exit code, so the files are
# counted, and any report fails the run), and prints ctest's summary, the failed tests, the
# report files and the wall times.
#
# Excluded by label: nothing. Tests that cannot run under a sanitizer skip themselves and say
# why (GTEST_SKIP), so they show as skipped, never silently absent.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
build_only=0
no_build=0
nice_cmd=()
presets=()
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) [ $# -ge 2 ] || { echo "sanitize.sh: -j needs a number (e.g. -j 2)" >&2; exit 2; }
        jobs="$2"; shift ;;
    -j*) jobs="${1#-j}" ;;
    --build-only) build_only=1 ;;
    --no-build) no_build=1 ;;
    --nice) nice_cmd=(nice -n 10) ;;
    asan|tsan) presets+=("$1") ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n "2,21p" "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#presets[@]} -gt 0 ] || { echo "sanitize.sh: name asan, tsan or both" >&2; exit 2; }

status=0
for preset in "${presets[@]}"; do
  reports_dir="$PWD/build/$preset/sanitizer-reports"
  rm -rf "$reports_dir"
  mkdir -p "$reports_dir"
  export ASAN_OPTIONS="detect_leaks=1:log_path=$reports_dir/asan"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports_dir/ubsan"
  export STRATA_TSAN_OPTIONS="log_path=$reports_dir/tsan"
  start=$(date +%s)
  if [ "$no_build" -eq 0 ] || [ ! -f "build/$preset/CTestTestfile.cmake" ]; then
    cmake --preset "$preset" -DSTRATA_WITH_CUDA=OFF >/dev/null
  fi
  [ "$no_build" -eq 1 ] || "${nice_cmd[@]}" cmake --build --preset "$preset" -j "$jobs"
  built=$(( $(date +%s) - start ))
  echo "sanitize.sh: $preset built in ${built} s"
  [ "$build_only" -eq 1 ] && continue
  log="build/$preset/sanitize.log"
  test_start=$(date +%s)
  rc=0
  "${nice_cmd[@]}" ctest --preset "$preset" -j "$jobs" --timeout 1500 "${ctest_args[@]}" \
    >"$log" 2>&1 || rc=$?
  reports=$(find "$reports_dir" -type f | wc -l)
  find "$reports_dir" -type f | head -20
  grep -E "tests passed|tests failed" "$log" || true
  grep -E "^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)" "$log" || true
  echo "sanitize.sh: $preset: ctest rc $rc, $reports sanitizer report file(s), tests took" \
    "$(( $(date +%s) - test_start )) s (log: $log)"
  if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then status=1; fi
done
exit $status
