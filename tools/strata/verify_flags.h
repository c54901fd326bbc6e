// The read flags `strata verify` and `strata export` share: how a run's stores are read
// (backend, request size, queue depth, O_DIRECT), as `strata bench io` names them. Internal
// to the CLI.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "strata/status.h"
#include "strata/store_reader.h"

namespace strata::cli {

struct StoreReadFlags {
  std::string io = "auto";
  std::string block = "1M";
  int queue_depth = 32;
  bool direct = true;

  // --io, --io-block, --queue-depth, --direct/--no-direct on `sub`.
  void Add(CLI::App* sub);
  // InvalidArgument naming the flag whose value is wrong.
  Result<StoreReaderOptions> Options() const;
};

}  // namespace strata::cli
