#!/usr/bin/env bash
# gpu_check_python.sh: the Python layer (import strata, strata.offload) on the lent GPU machine,
# with the torch installed there. tools/gpu_check.sh calls it (one PASS/FAIL line of its own);
# it also runs alone.
#
#   here:   the binding for the GPU machine's interpreter (Python 3.12 and a CUDA torch there;
#           the binding does not link libtorch, so only the interpreter's ABI matters):
#             cmake -S . -B build/py312 -G Ninja -DCMAKE_BUILD_TYPE=Release \
#                   -DPython_EXECUTABLE=/root/.pyenv/versions/3.12.1/bin/python3.12
#             cmake --build build/py312 --target strata_python
#           tools/gpu_check.sh --bundle build/release                # first: it empties the bundle
#           tools/gpu_check_python.sh --bundle build/py312            # -> build/gpu-bundle/python
#           tools/gpu_check_python.sh --dry-run                       # the same steps on this CPU
#           tools/gpu_check.sh --pack                                 # -> build/gpu-bundle.tar.xz
#   there:  tools/gpu_check.sh runs it (carry build/gpu-bundle.tar.xz: it unpacks the bundle);
#           alone, once the bundle is unpacked (tar -C build -xJf build/gpu-bundle.tar.xz):
#           tools/gpu_check_python.sh --out "$OUT/python"
#
# --from DIR names another bundle folder. --bundle copies BUILD/python/strata (the package, its
# _strata extension and libstrata) to BUNDLE/python/strata, the libraries libstrata needs that
# the GPU machine lacks to BUNDLE/lib (the rule of gpu_check.sh), and pytest with its
# dependencies (pure Python, from this machine's /usr/lib/python3/dist-packages) to
# BUNDLE/python/site, since the GPU machine's interpreter has no pytest. About 8 MiB.
#
# Steps, each with a PASS/FAIL line:
#   import  strata imports under the GPU machine's torch (the interpreter's ABI matches the
#           binding's), and sees the GPU (_strata.cuda_available and torch.cuda)
#   tests   tests/python with CUDA tensors: test_cuda.py's tests must run, not skip (offloaded
#           on the GPU: no host synchronisation inside a step, bit-identical to in memory,
#           within 1e-4 of resident torch; a bf16 model; fp16 refused), the rest as on the CPU
#   hf      bench/python_gpu.py --model hf: Hugging Face's GPT2LMHeadModel at GPT-2 small
#           (12 x 768, seq 512, batch 8) resident, offloaded with unlimited budgets, and
#           offloaded with a 512 MiB device budget (the states are ~2 GiB): offloaded == in
#           memory bit for bit, each within 1e-4 of resident, tokens/s of each. Without
#           transformers on the GPU machine: FAIL hf, and the same run with tests/python's GPT
#           at the same geometry (--model gpt), so the numbers are still measured.
# The dry run does each step on this machine's CPU with the binding of $STRATA_BUILD (default
# build/release) and its interpreter (test_cuda.py skips there; hf at a tiny geometry), and
# checks the bundle's contents. It is also a CTest test (gpu_check_python_dry_run).
#
# Sizing (estimated, not yet run on a GPU): import ~10 s, tests ~120 s, hf ~60 s (18 steps of
# GPT-2 small plus model set-up); each boxed at 5 minutes or less.
#
# Output: OUT/gpu_check_python.txt (the PASS/FAIL lines), OUT/gpu_check_python.log (every
# command's output), OUT/python_gpu.json (the hf step's numbers). Exit status 0 when every step
# passed, 1 otherwise, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=run
bundle=build/gpu-bundle
bundle_from=
out=${OUT:-build/gpu-check}/python
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) mode=dry ;;
    --bundle) mode=bundle; bundle_from=${2:?--bundle needs a build folder}; shift ;;
    --from) bundle=${2:?--from needs a bundle folder}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "gpu_check_python.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
provided_re='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux|linux-vdso)\.'
site_packages=(_pytest pytest pluggy iniconfig py py.py attr attrs)

# ---- --bundle ----
if [ "$mode" = bundle ]; then
  pkg=$bundle_from/python/strata
  ls "$pkg"/_strata.*.so >/dev/null 2>&1 ||
    { echo "gpu_check_python.sh: no $pkg/_strata.*.so: build the strata_python target there" >&2; exit 2; }
  rm -rf "$bundle/python" && mkdir -p "$bundle/python/site" "$bundle/lib"
  cp -rL "$pkg" "$bundle/python/strata"
  strip "$bundle/python/strata"/*.so* 2>/dev/null
  ldd "$pkg"/libstrata.so.* | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    while read -r name path; do
      [[ "$name" =~ $provided_re ]] || [ -e "$bundle/lib/$name" ] || cp -L "$path" "$bundle/lib/$name"
    done
  for p in "${site_packages[@]}"; do
    cp -r "/usr/lib/python3/dist-packages/$p" "$bundle/python/site/" ||
      { echo "gpu_check_python.sh: /usr/lib/python3/dist-packages/$p is missing (apt-get install python3-pytest)" >&2; exit 2; }
  done
  find "$bundle/python" -name __pycache__ -prune -exec rm -rf {} +
  echo "gpu_check_python.sh: bundle $bundle/python: $(du -sh "$bundle/python" | cut -f1) ($(basename "$bundle"/python/strata/_strata.*.so)); whole bundle $(du -sh "$bundle" | cut -f1)"
  exit 0
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
txt=$out/gpu_check_python.txt log=$out/gpu_check_python.log
: >"$txt"; : >"$log"
say() { echo "$*" | tee -a "$txt"; }
pass=0 fail=0
verdict() {  # verdict STEP RC TEXT
  if [ "$2" = 0 ]; then pass=$((pass + 1)); say "PASS $1: $3"; else fail=$((fail + 1)); say "FAIL $1: $3 (rc $2; see gpu_check_python.log)"; fi
}
run() {  # run LIMIT_S COMMAND...: output to the log (and $log.cur); the command's status
  local limit=$1; shift
  echo "+ $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >"$log.cur" 2>&1
  local rc=$?
  cat "$log.cur" >>"$log"
  return $rc
}

if [ "$mode" = dry ]; then
  build=${STRATA_BUILD:-$root/build/release}
  py=${PYTHON:-$(cat "$build/python/interpreter.txt" 2>/dev/null || echo /usr/bin/python3)}
  pkgdir=$build/python
  site=
  # The bundle, when there is one, must hold what the real run imports.
  if [ -d "$bundle/python" ]; then
    missing=
    ls "$bundle"/python/strata/_strata.*.so >/dev/null 2>&1 || missing+=" _strata"
    for p in _pytest pytest pluggy; do [ -e "$bundle/python/site/$p" ] || missing+=" $p"; done
    verdict bundle "$([ -z "$missing" ] && echo 0 || echo 1)" "$bundle/python${missing:+ lacks$missing}"
  else
    say "SKIP bundle: no $bundle/python (tools/gpu_check_python.sh --bundle BUILD)"
  fi
  hf=(--device cpu --layers 2 --dim 64 --heads 4 --seq 32 --batch 2 --vocab 512 --steps 3
      --device-mem 400K --host-mem 1M)
  tests=(tests/python/test_cuda.py tests/python/test_handoff.py)
else
  bundle=$(cd "$bundle" && pwd)
  pkgdir=$bundle/python site=$bundle/python/site
  # The interpreter the binding was built for (its ABI tag, cpython-312), with a CUDA torch.
  tag=$(basename "$bundle"/python/strata/_strata.*.so | sed -n 's/.*cpython-\([0-9]\)\([0-9]*\).*/\1.\2/p')
  py=${PYTHON:-}
  for c in "python$tag" python3 python /usr/bin/python3 /opt/conda/bin/python; do
    [ -n "$py" ] && break
    command -v "$c" >/dev/null && [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$tag" ] &&
      "$c" -c 'import torch' 2>/dev/null && py=$(command -v "$c")
  done
  [ -n "$py" ] || { say "FAIL import: no Python $tag with torch on this machine (set PYTHON)"; exit 1; }
  hf=(--device cuda)
  tests=(tests/python)
  for d in $("$py" -c 'import glob, os, sys; print(" ".join(d for p in sys.path for d in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib")))))' 2>/dev/null); do
    LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
  done
  export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
fi
export PYTHONPATH=$pkgdir${site:+:$site}:$root/tests/python${PYTHONPATH:+:$PYTHONPATH}
# transformers where tools/bootstrap.sh put it (as tests/python/conftest.py finds it).
pydeps=${STRATA_PYDEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/pydeps}
[ -d "$pydeps" ] && PYTHONPATH+=:$pydeps
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
say "# gpu_check_python $(date -u +%Y-%m-%dT%H:%M:%SZ) mode=$mode python=$py"

# ---- import ----
want_cuda=$([ "$mode" = run ] && echo 1 || echo 0)
run 120 "$py" -c '
import sys, torch, strata
cuda = torch.cuda.is_available() and strata._strata.cuda_available()
print("torch", torch.__version__, "cuda", torch.version.cuda, "strata", strata.__file__, "gpu", cuda)
sys.exit(0 if cuda or sys.argv[1] == "0" else 3)' "$want_cuda"
verdict import $? "$(tail -1 "$log.cur")"

# ---- tests ----
run 300 "$py" -m pytest -q -p no:cacheprovider -rs "${tests[@]}"
rc=$?
skipped_cuda=$(grep -c "SKIPPED.*test_cuda.py" "$log.cur")
[ "$mode" = run ] && [ "$rc" = 0 ] && [ "$skipped_cuda" != 0 ] && rc=5  # a GPU test skipped on a GPU
verdict tests $rc "$(grep -E '[0-9]+ (passed|failed)' "$log.cur" | tail -1)"

# ---- hf ----
json=$out/python_gpu.json
if run 60 "$py" -c 'import transformers'; then
  run 300 "$py" bench/python_gpu.py --model hf "${hf[@]}" --json "$json"
  rc=$?
else
  say "# transformers is not importable here: the same run with tests/python's GPT instead"
  run 300 "$py" bench/python_gpu.py --model gpt "${hf[@]}" --json "$json"
  rc=4
fi
summary=$([ -s "$json" ] && "$py" -c '
import json, sys
d = json.load(open(sys.argv[1]))
r, c = d["runs"], d["checks"]
print("%s: %s; offloaded == in memory bit for bit: %s; worst loss diff vs resident %s (tolerance %g)" % (
    d["model"], ", ".join("%s %.0f tok/s" % (k, v["tokens_per_s"]) for k, v in r.items()),
    c["offloaded_equals_in_memory"], c["worst_relative_loss_diff_vs_resident"], c["tolerance"]))' "$json")
verdict hf $rc "${summary:-no result}"

say "# $pass passed, $fail failed"
rm -f "$log.cur"
[ $fail = 0 ]
