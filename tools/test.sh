#!/usr/bin/env bash
# The README's test command: bootstrap -> configure -> build -> ctest.
#   tools/test.sh            Release build, whole suite
#   tools/test.sh --asan     the suite under ASan + UBSan
#   tools/test.sh --tsan     the suite under ThreadSanitizer
#   tools/test.sh --quick    skip tests labelled `slow` (ctest) or marked slow (pytest)
#   extra arguments after -- go to ctest (e.g. -- -L io, -- -R SwapStore)
# After ctest, when the Python binding was built (STRATA_WITH_PYTHON), pytest runs
# tests/python with the interpreter it was built for (not when ctest is given a selection
# after --), then again in the torch matrix's venv (tools/bootstrap.sh: PyPI's newest torch
# and transformers; STRATA_TORCH_MATRIX=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."

preset=release
ctest_args=()
pytest_args=()
selection=0
while [ $# -gt 0 ]; do
  case "$1" in
    --asan) preset=asan ;;
    --tsan) preset=tsan ;;
    --quick) ctest_args+=(-LE slow); pytest_args+=(-m "not slow") ;;
    --) shift; ctest_args+=("$@"); selection=1; break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

tools/bootstrap.sh
jobs=$(nproc)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
ctest --preset "$preset" -j "$jobs" --timeout 900 "${ctest_args[@]}"
py_dir="build/$preset/python"
if [ "$selection" -eq 0 ] && [ -f "$py_dir/interpreter.txt" ] &&
   ls "$py_dir"/strata/_strata*.so >/dev/null 2>&1; then
  py=$(cat "$py_dir/interpreter.txt")
  PYTHONPATH="$py_dir" "$py" -m pytest -q "${pytest_args[@]}" tests/python
  venv="${STRATA_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/venv-torch-matrix}"
  soabi='import sysconfig; print(sysconfig.get_config_var("SOABI"))'
  if [ "${STRATA_TORCH_MATRIX:-1}" != 0 ] && [ -x "$venv/bin/python" ]; then
    if [ "$("$venv/bin/python" -c "$soabi")" = "$("$py" -c "$soabi")" ]; then
      echo "test.sh: tests/python under $("$venv/bin/python" -c 'import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)')"
      # STRATA_PYDEPS: not the pydeps folder (transformers 4.47 for torch 1.13).
      STRATA_PYDEPS="$venv/no-pydeps" PYTHONPATH="$py_dir" "$venv/bin/python" -m pytest -q \
        "${pytest_args[@]}" tests/python
    else
      echo "test.sh: warning: $venv is another CPython than $py, which the binding was" \
        "built for; tests/python ran once" >&2
    fi
  fi
fi
