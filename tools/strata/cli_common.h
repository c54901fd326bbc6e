// Helpers shared by the `strata` subcommands (tools/strata/*.cc): byte sizes parsed from the
// command line. Joining the ranks (JoinRanks, CreateEngineNccl, TempFolder, RankPath) is in
// comm/join.h; the flags every run shares, in run_flags.h.
//
// Internal to the CLI, not a library API. Nothing here prints: each function returns a
// Status whose message names the flag and the value, and the subcommand reports it in its
// own style ("strata train: ...", "strata bench step: ..."). No shared state: the functions
// may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "comm/join.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::cli {

// A byte count in binary units: "4096", "512K", "64M", "1.5G", "2T", "64KiB", "96MB" (the
// suffix is case-insensitive; a trailing B or iB is optional). Fractions round to the
// nearest byte. Errors: InvalidArgument "<flag> <text> is not a size; ..." for an empty,
// negative, malformed or out-of-range (over 9e18 bytes) value, or an unknown suffix.
Result<uint64_t> ParseBytes(std::string_view flag, const std::string& text);

// A memory budget (--host-mem, --device-mem): a size as ParseBytes reads it, or the word
// `unlimited`, returned as 0 (RunConfig's "no budget"). A size of 0 is refused naming the
// flag: it reads as "no memory" but would mean no limit, so the word must say it.
Result<uint64_t> ParseBudget(std::string_view flag, const std::string& text);

// Writes `text` to the file a --json-style flag names, or to standard output when `path`
// is "-". Errors: IOError naming `flag` and the path when the file cannot be written.
Status WriteOutput(std::string_view flag, const std::string& path, const std::string& text);

}  // namespace strata::cli
