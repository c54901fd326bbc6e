#!/usr/bin/env bash
# The README's main-job command. Builds Strata (Release) and runs the main job.
# Until `strata train` exists, the main job is `strata bench io` on a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target strata
work=$(mktemp -d "${TMPDIR:-/var/tmp}/strata-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
build/release/tools/strata bench io --path "$work" --size 256M --mode write --mode read \
  --mode randread
