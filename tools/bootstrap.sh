#!/usr/bin/env bash
# Installs the Debian packages Strata builds with, when any is missing. Idempotent: when all
# are present it installs nothing and does not touch apt's lists.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  liburing-dev libtbb-dev libcli11-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libxxhash-dev libgloo-dev libhiredis-dev libopenblas-dev
  fio redis-server
  # the Python binding (python/) and its tests: CPU torch 1.13 for /usr/bin/python3
  python3-dev pybind11-dev python3-pytest python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "bootstrap: need root to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
