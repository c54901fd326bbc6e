#!/usr/bin/env bash
# Installs the Debian packages Strata builds with, when any is missing, then the PyPI-only
# packages the Hugging Face test and example need (see pydeps below). Idempotent: when all are
# present it installs nothing, prints nothing and does not touch apt's lists.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  liburing-dev libtbb-dev libcli11-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libxxhash-dev libgloo-dev libhiredis-dev libopenblas-dev libssl-dev
  fio redis-server
  # tools/check_lengths.py (CTest source_lengths): the C++ functions' lengths
  universal-ctags
  # the Python binding (python/) and its tests: CPU torch 1.13 for /usr/bin/python3
  python3-dev pybind11-dev python3-pytest python3-torch
  # what transformers, accelerate and peft import that Debian ships (jinja2: peft's model card;
  # the PyPI-only rest: pydeps below)
  python3-numpy python3-regex python3-requests python3-yaml python3-tqdm python3-filelock
  python3-packaging python3-typing-extensions python3-pip python3-jinja2 python3-psutil
)
# bench/vs_deepspeed.py's DeepSpeed (opt-in, below): its NVMe offload (async_io) needs libaio.
if [ "${STRATA_DEEPSPEED:-0}" = 1 ]; then packages+=(libaio-dev); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

install_debian() {
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "bootstrap: installing ${missing[*]}"
  local SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then SUDO="sudo"; else
      echo "bootstrap: need root to install: ${missing[*]}" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
}
install_debian

# pydeps: transformers and its PyPI-only dependencies for /usr/bin/python3 (Debian's torch
# 1.13), in a folder outside the repository that a fresh clone reuses; tests/python/conftest.py
# puts it on sys.path (STRATA_PYDEPS overrides the place in both). Exact pins and --no-deps, so
# pip never brings another torch or numpy: transformers 4.47.1 is the newest release whose
# Trainer imports with torch 1.13 (4.48 and 4.49 import torch 2's LRScheduler there and declare
# torch>=2.0; 4.50 imports torch.distributed.tensor at all); tokenizers, huggingface_hub,
# accelerate and peft are within its bounds and torch 1.13's. A folder holding other pins (each
# pin's dist-info is looked for) is replaced whole. Without network (or pip) the step warns and
# the tests that need it are skipped.
pydeps_pins=(transformers==4.47.1 tokenizers==0.21.4 huggingface_hub==0.30.2 safetensors==0.5.3
  accelerate==0.34.2 peft==0.13.2 fsspec==2024.12.0)
pydeps="${STRATA_PYDEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/pydeps}"
pydeps_ok=1
for pin in "${pydeps_pins[@]}"; do
  [ -d "$pydeps/${pin%%==*}-${pin##*==}.dist-info" ] || pydeps_ok=0
done
if [ "$pydeps_ok" -eq 0 ]; then
  echo "bootstrap: installing ${pydeps_pins[*]} into $pydeps"
  tmp="$pydeps.tmp.$$" log="$pydeps.pip.log"
  rm -rf "$tmp"
  if mkdir -p "$(dirname "$pydeps")" &&
     /usr/bin/python3 -m pip install -q --disable-pip-version-check --no-input --retries 2 \
       --no-deps --target "$tmp" "${pydeps_pins[@]}" >"$log" 2>&1; then
    rm -rf "$pydeps" "$log"
    mv "$tmp" "$pydeps"
  else
    echo "bootstrap: warning: pip could not install ${pydeps_pins[*]} (no network?); the" \
      "Hugging Face test will be skipped; pip's output: $log" >&2
    rm -rf "$tmp"
  fi
fi

# The torch matrix: tools/test.sh runs tests/python a second time under PyPI's newest torch
# and transformers, in a venv over /usr/bin/python3 outside the repository (Debian's torch
# 1.13 is what /usr/bin/python3 has). Same CPython, so the binding built for /usr/bin/python3
# imports there unchanged (it links no libtorch). Every package is pinned, --no-deps, by
# tools/torch-matrix-requirements.txt; the venv keeps a copy, so a changed list reinstalls it.
# PyPI's torch for Linux is a CUDA build: its nvidia-* wheels come along (about 6 GiB).
# STRATA_TORCH_MATRIX=0 skips it (and the second run); without network the step warns and
# tests/python runs once.
matrix_lock="$(dirname "$0")/torch-matrix-requirements.txt"
matrix_venv="${STRATA_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/venv-torch-matrix}"
if [ "${STRATA_TORCH_MATRIX:-1}" != 0 ] && ! cmp -s "$matrix_lock" "$matrix_venv/requirements.txt"
then
  echo "bootstrap: installing the torch matrix's $(grep -E '^(torch|transformers)==' \
    "$matrix_lock" | tr '\n' ' ')into $matrix_venv"
  log="$matrix_venv.pip.log"
  rm -rf "$matrix_venv"
  if mkdir -p "$(dirname "$matrix_venv")" && /usr/bin/python3 -m venv "$matrix_venv" &&
     "$matrix_venv/bin/python" -m pip install -q --disable-pip-version-check --no-input \
       --retries 2 --no-deps -r "$matrix_lock" >"$log" 2>&1; then
    cp "$matrix_lock" "$matrix_venv/requirements.txt"
    rm -f "$log"
  else
    echo "bootstrap: warning: pip could not install the torch matrix (no network?);" \
      "tests/python runs under /usr/bin/python3 only; pip's output: $log" >&2
    rm -rf "$matrix_venv"
  fi
fi

# DeepSpeed for bench/vs_deepspeed.py, opt-in (STRATA_DEEPSPEED=1): deepspeed 0.19.8 into the
# torch-matrix venv (pip adds its own small dependencies; torch stays the venv's), then its
# CPU ops built once, as DeepSpeed builds them on first use with DS_ACCELERATOR=cpu: cpu_adam,
# shm_comm and async_io (6-20 minutes on 2 cores; the build lands in torch's extensions cache,
# ~/.cache/torch_extensions). Without network the step warns and the bench skips DeepSpeed.
if [ "${STRATA_DEEPSPEED:-0}" = 1 ] && [ -x "$matrix_venv/bin/python" ] &&
   ! "$matrix_venv/bin/python" -c 'import importlib.metadata as m, sys
sys.exit(m.version("deepspeed") != "0.19.8")' 2>/dev/null; then
  echo "bootstrap: installing deepspeed 0.19.8 into $matrix_venv and building its CPU ops"
  log="$matrix_venv.deepspeed.log"
  if DS_BUILD_OPS=0 "$matrix_venv/bin/python" -m pip install -q --disable-pip-version-check \
       --no-input --retries 2 deepspeed==0.19.8 >"$log" 2>&1 &&
     DS_ACCELERATOR=cpu "$matrix_venv/bin/python" -c '
from deepspeed.accelerator import get_accelerator
for name in ("CPUAdamBuilder", "ShareMemCommBuilder", "AsyncIOBuilder"):
    get_accelerator().create_op_builder(name).load()' >>"$log" 2>&1; then
    rm -f "$log"
  else
    echo "bootstrap: warning: deepspeed 0.19.8 could not be installed or built; see $log" >&2
  fi
fi
