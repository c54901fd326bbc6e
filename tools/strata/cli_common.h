// Helpers shared by the `strata` subcommands (tools/strata/*.cc): byte sizes parsed from the
// command line. Joining the ranks (JoinRanks, CreateEngineNccl, TempFolder, RankPath) is in
// comm/join.h; the flags every run shares, in run_flags.h.
//
// Internal to the CLI, not a library API. Nothing here prints: each function returns a
// Status whose message names the flag and the value, and the subcommand reports it in its
// own style ("strata train: ...", "strata bench step: ..."). No shared state: the functions
// may be called from any thread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "comm/join.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/env.h"
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

// The NVMe I/O settings of `eo` in words: "requests of 1 MiB, queue depth 32, uring,
// O_DIRECT, registered buffers" (what --io-config and --io-block set).
std::string IoSettingsText(const EngineOptions& eo);

// Writes `text` to the file a --json-style flag names, or to standard output when `path`
// is "-". Errors: IOError naming `flag` and the path when the file cannot be written.
Status WriteOutput(std::string_view flag, const std::string& path, const std::string& text);

// Checks, before any work, that WriteOutput can later write `path`: nothing to check for an
// empty path (no output) or "-" (standard output), else CheckOutputPath's checks. Errors:
// InvalidArgument naming `flag` and the path.
Status CheckOutput(std::string_view flag, const std::string& path);

// Where a --json FILE goes, the same in every subcommand: a file, or with "-" standard
// output, which then carries the JSON alone: while this object lives, whatever the command
// prints to standard output (fd 1) goes to standard error instead. Restored on destruction.
class JsonDestination {
 public:
  explicit JsonDestination(std::string path);
  ~JsonDestination();
  JsonDestination(const JsonDestination&) = delete;
  JsonDestination& operator=(const JsonDestination&) = delete;

  bool enabled() const { return !path_.empty(); }
  // Writes the document (to the file, or the real standard output). Errors: WriteOutput's.
  Status Write(std::string_view flag, const std::string& text) const;

 private:
  std::string path_;
  int saved_stdout_ = -1;  // with "-": the real standard output
};

// A switch as --NAME and --no-NAME, its help saying what it is by default ("(default: on)"
// from *value's starting value). `--NAME false` (and `NAME = false` in a config file) also
// turns it off. Returns the --NAME option (its count() says whether it was given).
CLI::Option* AddSwitch(CLI::App* cmd, const std::string& name, bool* value,
                       const std::string& help);

// The most threads --threads takes: a typo (100000) would otherwise start that many OpenMP
// threads, and the run would fail in thread creation (or crash) rather than at the flag.
inline constexpr int kMaxThreads = kMaxCpuThreads;

// --threads for the commands that run the model alone on the CPU (bench model, eval,
// generate): 0 to kMaxThreads, 0 meaning ResolveThreads' default.
void AddModelThreadsFlag(CLI::App* cmd, int* threads);

// Threads for CPU work: `flag` when > 0, else STRATA_NUM_THREADS when > 0, else 0 (one per
// core, OpenMP's default).
int ResolveThreads(int flag);
// Sets the calling thread's OpenMP team size for the model's CPU ops (0: leaves it).
void SetComputeThreads(int threads);

}  // namespace strata::cli
