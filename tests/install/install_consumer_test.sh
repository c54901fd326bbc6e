#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds and runs tests/install/consumer against
# it with find_package(Strata) alone, from a clean environment (no path into the source tree).
#   install_consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
test -f "$tmp/prefix/include/strata/engine.h"
ls "$tmp"/prefix/lib*/libstrata.so >/dev/null
cmake -S "$src/tests/install/consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log"
cmake --build "$tmp/build" >"$tmp/build.log"
mkdir -p "$tmp/nvme"
env -u LD_LIBRARY_PATH "$tmp/build/strata_consumer" "$tmp/nvme"
