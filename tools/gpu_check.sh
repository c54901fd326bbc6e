#!/usr/bin/env bash
# gpu_check.sh: the one command that proves Strata's CUDA path on a machine with a GPU.
#
# It runs from a bundle built on another machine (the device machine has no compiler toolchain
# we rely on and reaches no package registry):
#
#   here:   cmake --preset release && cmake --build --preset release
#           tools/gpu_check.sh --bundle build/release          # -> build/gpu-bundle (bin/, lib/)
#           tools/gpu_check.sh --dry-run                       # the same sequence, no GPU needed
#   there:  tools/gpu_check.sh --out "$OUT"                    # carry build/gpu-bundle
#
# --from DIR names another bundle folder (for --bundle: where to write it). The dry run is also
# a CTest test (gpu_check_dry_run) wherever the CUDA targets are built.
#
# The bundle holds the binaries below, stripped, and the shared libraries they need that are not
# part of the base system or of the CUDA installation the GPU machine already has (liburing,
# oneTBB, Gloo, OpenBLAS, xxHash, gomp, the CUDA runtime). cuBLAS, cuBLASLt and NCCL are too
# large to carry (cuBLASLt alone is over 500 MiB and the toolkit here has no static cuBLAS or
# NCCL): they are taken from the GPU machine's CUDA toolkit or its Python wheels (nvidia-cublas,
# nvidia-nccl), found by the search below. `--bundle` prints the bundle's size.
#
# Steps, each time-boxed, each with its own PASS/FAIL line:
#   device   the GPU, driver and runtime from nvidia-smi when present, and from the CUDA API
#            itself (gpu_model_bench --query), which needs no nvidia-smi
#   tests    the gpu-labelled GoogleTest binaries (CudaDevice conformance, CUDA ops vs CPU ops
#            with the measured tolerances, offloaded CUDA bit-identical to GPU-resident, a
#            one-rank NCCL communicator through the engine); a test that skips on a GPU machine
#            counts as a failure, except the one that needs two GPUs
#   bench    gpu_model_bench --json: tokens/s at GPT-2 small, H2D/D2H GB/s against a plain
#            cudaMemcpy of pinned memory in the same run
#   train    strata train --device cuda on a small GPT (8 x 256), resident, then offloaded at
#            the smallest budgets the engine accepts (the device holds one block's parameters
#            and gradient, far under a quarter of the states; the optimizer states spill to
#            local disk), then resident again over a one-rank NCCL communicator: losses equal
#            step by step, and the step time and efficiency of each; then the same (without
#            NCCL) at GPT-2 small's geometry
#
# Sizing on one H200 (the whole run must fit in 10 minutes with room to rerun once; device time
# is 15 minutes a session, start-up included). Estimated before the first run: device ~2 s,
# tests ~60 s, bench ~30 s, train ~150 s. Measured on the first run (2026-12-01, H200, driver
# 580.159.04): the whole script took 65 s, start-up of the machine ~30 s more. Each command is
# boxed at 1-5 minutes so one hang cannot eat the budget; the worst case stays under 10.
#
# Output: $OUT/gpu_check.json (everything measured) and $OUT/gpu_check.txt (the PASS/FAIL
# lines and tables), plus $OUT/gpu_check.log (every command's full output). OUT defaults to
# build/gpu-check. Exit status: 0 when every step passed, 1 otherwise, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=run
bundle=build/gpu-bundle
bundle_from=
out=${OUT:-build/gpu-check}

usage() { sed -n '2,48p' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) mode=dry ;;
    --bundle) mode=bundle; bundle_from=${2:?--bundle needs a build folder}; shift ;;
    --from) bundle=${2:?--from needs a bundle folder}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# The binaries the check runs, by their path in a build folder.
tests=(tests/gpu/gpu_device_test tests/gpu/gpu_cuda_device_gpu_test
       tests/comm/comm_nccl_communicator_test tests/model/cuda/model_gpt2_cuda_ops_test
       tests/trainer/train_cuda_test)
tools=(bench/gpu_model_bench tools/strata)

# Libraries the GPU machine provides (its CUDA install or driver) and the base system's.
provided_re='^(libcuda|libcublas|libcublasLt|libnccl|libnvidia|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux|linux-vdso)\.'

# ---- --bundle: collect binaries and libraries from a build folder ----
if [ "$mode" = bundle ]; then
  [ -d "$bundle_from" ] || { echo "gpu_check.sh: no build folder $bundle_from" >&2; exit 2; }
  rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib"
  for b in "${tests[@]}" "${tools[@]}"; do
    if [ ! -x "$bundle_from/$b" ]; then
      echo "gpu_check.sh: $bundle_from/$b is missing: build with CUDA (nvcc in /usr/local/cuda)" >&2
      exit 1
    fi
    strip -o "$bundle/bin/$(basename "$b")" "$bundle_from/$b"
    ldd "$bundle_from/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
      while read -r name path; do
        if ! [[ "$name" =~ $provided_re ]] && [ ! -e "$bundle/lib/$name" ]; then
          cp -L "$path" "$bundle/lib/$name"
        fi
      done
  done
  git rev-parse HEAD >"$bundle/COMMIT" 2>/dev/null || echo unknown >"$bundle/COMMIT"
  git status --porcelain 2>/dev/null | grep -q . && echo "(with uncommitted changes)" >>"$bundle/COMMIT"
  echo "gpu_check.sh: bundle $bundle: $(du -sh "$bundle" | cut -f1) ($(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries: $(ls "$bundle/lib" | tr '\n' ' '))"
  exit 0
fi

[ -d "$bundle/bin" ] || { echo "gpu_check.sh: no bundle at $bundle (make one with --bundle BUILD)" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
bin=$bundle/bin
mkdir -p "$out"
out=$(cd "$out" && pwd)
txt=$out/gpu_check.txt log=$out/gpu_check.log
: >"$txt"; : >"$log"
work=$(mktemp -d "${TMPDIR:-/tmp}/strata-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
results=$work/results.jsonl  # one JSON object per step, merged at the end
say() { echo "$*" | tee -a "$txt"; }

# Library search path: the bundle first, then wherever this machine keeps CUDA's libraries.
libdirs=("$bundle/lib")
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
         /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && libdirs+=("$d")
done
for py in python3 /usr/bin/python3; do
  command -v "$py" >/dev/null || continue
  while read -r d; do libdirs+=("$d"); done < <("$py" - 2>/dev/null <<'PY'
import glob, os, sys
for p in sys.path:
    for d in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib"))):
        print(d)
PY
)
done
LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
# Anything still unresolved (a CUDA library in a place not listed above): look for it by name.
if [ "$mode" = run ]; then
  for name in $(for b in "$bin"/*; do ldd "$b" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u); do
    found=$(find /usr /opt /lib /root -name "$name" -not -path '*/proc/*' 2>/dev/null | head -1)
    [ -n "$found" ] && LD_LIBRARY_PATH=$(dirname "$found"):$LD_LIBRARY_PATH
  done
fi

pass=0 fail=0
record() {  # record STEP STATUS JSON-OBJECT
  local step=$1 status=$2 json=${3:-"{}"}
  if [ "$status" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
  # One compact line per step (the data may be pretty-printed or, after a failure, not JSON).
  "${PYTHON:-python3}" -c '
import json, sys
try:
    data = json.loads(sys.argv[3])
except ValueError:
    data = {"unparsed": sys.argv[3]}
print(json.dumps({"step": sys.argv[1], "status": sys.argv[2], "data": data}))' \
    "$step" "$status" "$json" >>"$results"
}

# Every binary present, and every library it needs resolved (the dry run's whole check, and
# the real run's first).
check_libs() {
  local b missing bad=0
  for b in "${tests[@]}" "${tools[@]}"; do
    b=$(basename "$b")
    if [ ! -x "$bin/$b" ]; then say "FAIL libs: $b is not in the bundle"; bad=1; continue; fi
    missing=$(ldd "$bin/$b" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
    if [ -n "$missing" ]; then say "FAIL libs: $b cannot find $missing"; bad=1; fi
  done
  if [ $bad = 0 ]; then
    say "PASS libs: ${#tests[@]} tests and ${#tools[@]} tools resolve every library"
    record libs PASS
  else
    record libs FAIL
  fi
  return $bad
}

# run LIMIT_S COMMAND...: the command's output goes to the log; returns its status (124 on
# timeout).
run() {
  local limit=$1; shift
  echo "+ $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log.cur" 2>&1
  local rc=$?
  cat "$log.cur" >>"$log"
  return $rc
}

say "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) mode=$mode bundle=$bundle host=$(hostname)"
say "# bundle built from commit $(tr '\n' ' ' <"$bundle/COMMIT" 2>/dev/null || echo unknown)"

if [ "$mode" = dry ]; then
  check_libs
  for step in device tests bench train; do say "DRY  $step: would run on a GPU"; done
else
  # ---- device ----
  smi=none
  if command -v nvidia-smi >/dev/null; then
    smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
          --format=csv,noheader 2>>"$log" | head -1)
  fi
  say "# nvidia-smi: $smi"
  check_libs
  : >"$log.cur"
  if run 60 "$bin/gpu_model_bench" --query; then
    q=$(tail -1 "$log.cur")
    say "PASS device: $q"
    record device PASS "{\"cuda\":$q,\"nvidia_smi\":\"$smi\"}"
  else
    say "FAIL device: the CUDA runtime sees no GPU: $(tail -1 "$log.cur")"
    record device FAIL "{\"nvidia_smi\":\"$smi\"}"
  fi

  # ---- tests ----
  for t in "${tests[@]}"; do
    t=$(basename "$t")
    : >"$log.cur"
    run 240 "$bin/$t" --gtest_output="json:$work/$t.json"
    rc=$?
    summary=$("${PYTHON:-python3}" - "$work/$t.json" "$log.cur" <<'PY'
import json, re, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception:
    print(json.dumps({"error": "no gtest report"})); sys.exit()
passed, failed, skipped = [], [], []
for suite in doc.get("testsuites", []):
    for t in suite.get("testsuite", []):
        name = suite["name"] + "." + t["name"]
        if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
            skipped.append(name)
        elif t.get("failures"):
            failed.append(name)
        else:
            passed.append(name)
tol = {}
for line in open(sys.argv[2], errors="replace"):
    m = re.match(r"\[tolerance\] (.+) needed_rtol=(\S+) rtol=(\S+) atol=(\S+)", line)
    if m:
        prev = tol.get(m.group(1), {}).get("needed_rtol", 0.0)
        tol[m.group(1)] = {"needed_rtol": max(prev, float(m.group(2))),
                           "rtol": float(m.group(3))}
print(json.dumps({"passed": len(passed), "failed": failed, "skipped": skipped,
                  "tolerances": tol}))
PY
)
    # On a GPU machine only the two-GPU test may skip.
    bad_skips=$(echo "$summary" | "${PYTHON:-python3}" -c \
      'import json,sys; d=json.load(sys.stdin); print(" ".join(s for s in d.get("skipped",[]) if "TwoGpus" not in s))')
    if [ $rc = 0 ] && [ -z "$bad_skips" ]; then
      say "PASS test $t: $(echo "$summary" | "${PYTHON:-python3}" -c 'import json,sys; d=json.load(sys.stdin); print(d.get("passed"), "passed,", len(d.get("skipped",[])), "skipped")')"
      record "test:$t" PASS "$summary"
    else
      why="exit $rc"; [ $rc = 124 ] && why="timed out"
      [ -n "$bad_skips" ] && why="$why; skipped on a GPU machine: $bad_skips"
      say "FAIL test $t: $why (see gpu_check.log)"
      record "test:$t" FAIL "$summary"
    fi
  done

  # ---- bench ----
  : >"$log.cur"
  if run 180 "$bin/gpu_model_bench" --layers 12 --d-model 768 --heads 12 --seq-len 1024 \
       --batch 8 --vocab 50257 --iters 10 --json "$work/bench.json" && [ -s "$work/bench.json" ]; then
    say "PASS bench: $("${PYTHON:-python3}" -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d["model"]; print("%.0f tokens/s, %.1f TFLOP/s, step %.1f ms" % (m["tokens_per_s"], m["tflops"], m["step_ms"]))' "$work/bench.json")"
    record bench PASS "$(cat "$work/bench.json")"
  else
    say "FAIL bench: gpu_model_bench failed or wrote no JSON (see gpu_check.log)"
    record bench FAIL
  fi
  grep -E '^(#|copy|model|[a-z0-9_ +/-]+ +[0-9])' "$log.cur" | tail -20 >>"$txt"

  # ---- train ----
  # Each case trains the same model three ways: resident; offloaded at the smallest budgets the
  # engine accepts (each asked of the engine by a one-step probe that prints "need at least N
  # bytes"): every block is swapped onto the device each pass (the device budget is one block's
  # parameters and gradient, far under a quarter of the states) and the optimizer states spill
  # to local disk; and (small case) resident over a one-rank NCCL communicator.
  dev=${GPU_CHECK_TRAIN_DEVICE:-cuda}  # cpu: try the step's logic on a machine without a GPU
  nvme=$work/nvme && mkdir -p "$nvme"
  minimum() {  # minimum FLAG ARGS...: the engine's smallest accepted value of FLAG, in bytes
    local flag=$1; shift
    rm -rf "${nvme:?}"/*
    timeout 120 "$bin/strata" train "${geometry[@]}" --steps 1 "$@" "$flag" 4K --nvme "$nvme" 2>&1 |
      tee -a "$log" | sed -n 's/.*need at least [^(]*(\([0-9]*\) bytes).*/\1/p' | head -1
  }
  train_case() {  # train_case NAME STEPS NCCL(0|1) GEOMETRY...
    local name=$1 steps=$2 nccl=$3; shift 3
    geometry=(--device "$dev" "$@" --lr 1e-3 --seed 7 --val-every 0)
    local ok=1 dmin hmin cmp summary
    local dir=$work/$name && mkdir -p "$dir"
    : >"$log.cur"
    run 240 "$bin/strata" train "${geometry[@]}" --steps "$steps" --json "$dir/resident.json" || ok=0
    dmin=$(minimum --device-mem --host-mem 64G)
    hmin=$(minimum --host-mem --device-mem "${dmin:-0}")
    echo "# $name: probed minimums --device-mem ${dmin:-?} --host-mem ${hmin:-?} bytes" | tee -a "$txt"
    if [ $ok = 1 ] && [ -n "$dmin" ] && [ -n "$hmin" ]; then
      rm -rf "${nvme:?}"/*
      run 300 "$bin/strata" train "${geometry[@]}" --steps "$steps" --device-mem "$dmin" \
        --host-mem "$hmin" --nvme "$nvme" --json "$dir/offloaded.json" || ok=0
    else
      ok=0
    fi
    if [ $ok = 1 ] && [ "$nccl" = 1 ] && [ "$dev" = cuda ]; then
      run 180 "$bin/strata" launch -n 1 -- "$bin/strata" train "${geometry[@]}" --steps "$steps" \
        --comm-backend nccl --json "$dir/nccl.json" || ok=0
    fi
    cmp=$("${PYTHON:-python3}" - "$dir" <<'PY'
import json, os, sys
w = sys.argv[1]
runs = {}
for name in ("resident", "offloaded", "nccl"):
    p = os.path.join(w, name + ".json")
    if os.path.exists(p):
        d = json.load(open(p))
        steps = d.get("steps", [])
        skip = min(3, max(0, len(steps) - 1))  # the first steps warm up
        secs = sorted(s["seconds"] for s in steps[skip:]) or [0]
        effs = sorted(s["efficiency"] for s in steps[skip:]) or [0]
        runs[name] = {"losses": [s["loss"] for s in steps],
                      "median_step_s": secs[len(secs) // 2],
                      "median_efficiency": effs[len(effs) // 2],
                      "tokens_per_s": sorted(s["tokens_per_s"] for s in steps[skip:])[len(secs) // 2] if steps else 0,
                      "bytes_per_step": steps[-1].get("bytes") if steps else None,
                      "device": d["config"].get("device"),
                      "device_mem": d["config"].get("device_mem"),
                      "host_mem": d["config"].get("host_mem"),
                      "params": d["config"].get("params")}
res = runs.get("resident", {}).get("losses", [])
for name, r in runs.items():
    if name != "resident":
        r["equal_to_resident"] = bool(res) and r["losses"] == res
        r["max_abs_diff"] = max((abs(a - b) for a, b in zip(r["losses"], res)), default=None)
print(json.dumps(runs))
PY
)
    summary=$(echo "$cmp" | "${PYTHON:-python3}" -c '
import json, sys
runs = json.load(sys.stdin)
for n, r in runs.items():
    eq = "" if n == "resident" else "  equal to resident: %s (max |diff| %s)" % (r["equal_to_resident"], r["max_abs_diff"])
    print("  %-9s %d steps, loss %.4f -> %.4f, %.4f s/step, %.0f tok/s, eff %.2f%s" % (n, len(r["losses"]), r["losses"][0] if r["losses"] else 0, r["losses"][-1] if r["losses"] else 0, r["median_step_s"], r["tokens_per_s"], r["median_efficiency"], eq))
ok = len(runs) >= 2 and all(r.get("equal_to_resident", True) for r in runs.values())
print("OK" if ok else "MISMATCH")')
    if [ $ok = 1 ] && [ "$(echo "$summary" | tail -1)" = OK ]; then
      say "PASS train $name: $(echo "$cmp" | "${PYTHON:-python3}" -c 'import json,sys; print(", ".join(json.load(sys.stdin)))') runs give the same losses step by step (offloaded: minimum budgets, states on disk)"
      record "train:$name" PASS "$cmp"
    else
      say "FAIL train $name: a run failed or the losses differ (see gpu_check.log)"
      record "train:$name" FAIL "${cmp:-{\}}"
    fi
    echo "$summary" | sed '$d' | tee -a "$txt"
  }
  train_case small 40 1 --layers 8 --d-model 256 --heads 4 --seq-len 128 --batch 8
  # GPT-2 small's blocks (12 x 768) on byte tokens: the scale at which the step times mean
  # something; its states (~1.4 GiB) go to disk in the offloaded run.
  [ "$dev" = cuda ] && train_case gpt2s 8 0 --layers 12 --d-model 768 --heads 12 --seq-len 512 --batch 8
fi

# ---- python: the Python layer on the GPU, tools/gpu_check_python.sh (its lines in python/) ----
pyargs=(--from "$bundle" --out "$out/python"); [ "$mode" = dry ] && pyargs+=(--dry-run)
if [ ! -d "$bundle/python" ]; then
  say "$([ "$mode" = dry ] && echo SKIP || echo FAIL) python: no python/ in the bundle (tools/gpu_check_python.sh --bundle BUILD)"
  [ "$mode" = dry ] || record python FAIL
elif timeout --kill-after=10 540 tools/gpu_check_python.sh "${pyargs[@]}" >>"$log" 2>&1; then
  say "PASS python: $(grep ^PASS "$out/python/gpu_check_python.txt" | cut -d: -f1 | tr '\n' ' ')(python/gpu_check_python.txt)"; record python PASS
else
  say "FAIL python: $(grep ^FAIL "$out/python/gpu_check_python.txt" | cut -c1-200 | tr '\n' ' ')"; record python FAIL
fi
say "# $pass passed, $fail failed"
"${PYTHON:-python3}" - "$results" "$out/gpu_check.json" "$mode" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[1] else []
json.dump({"mode": sys.argv[3], "steps": steps,
           "passed": sum(s["status"] == "PASS" for s in steps),
           "failed": sum(s["status"] != "PASS" for s in steps)},
          open(sys.argv[2], "w"), indent=1)
PY
rm -f "$log.cur"
[ $fail = 0 ]
