// Helpers shared by the `strata` subcommands; see cli_common.h.
#include "tools/strata/cli_common.h"

#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "strata/atomic_file.h"
#include "strata/env.h"
#include "tools/strata/io_bench.h"

namespace strata::cli {

Result<uint64_t> ParseBytes(std::string_view flag, const std::string& text) {
  auto fail = [&] {
    return Status::InvalidArgument(std::string(flag) + " " + text +
                                   " is not a size; use a number with an optional K, M, G or T "
                                   "suffix (binary units), e.g. 4096, 512K, 64M, 1.5G");
  };
  if (text.empty()) return fail();
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {  // std::invalid_argument or std::out_of_range: not a number
    return fail();
  }
  std::string suffix = text.substr(pos);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() >= 2 && suffix.compare(suffix.size() - 2, 2, "IB") == 0) {
    suffix.resize(suffix.size() - 2);
  } else if (!suffix.empty() && suffix.back() == 'B') {
    suffix.pop_back();
  }
  double mult = 1;
  if (suffix == "K") {
    mult = 1024.0;
  } else if (suffix == "M") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G") {
    mult = 1024.0 * 1024 * 1024;
  } else if (suffix == "T") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else if (!suffix.empty()) {
    return fail();
  }
  // Written so that NaN fails too; 9e18 stays below 2^63, where the conversion is exact.
  if (!(v >= 0 && v * mult <= 9.0e18)) return fail();
  return static_cast<uint64_t>(v * mult + 0.5);
}

Result<uint64_t> ParseBudget(std::string_view flag, const std::string& text) {
  if (text == "unlimited") return uint64_t{0};
  STRATA_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes(flag, text));
  if (bytes == 0) {
    return Status::InvalidArgument(std::string(flag) + " " + text +
                                   ": a budget of 0 bytes holds nothing; give a size (e.g. "
                                   "256M) or the word unlimited");
  }
  return bytes;
}

Status CheckOutput(std::string_view flag, const std::string& path) {
  if (path.empty() || path == "-") return Status::OK();
  return CheckOutputPath(path, flag);
}

Status WriteOutput(std::string_view flag, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return Status::OK();
  }
  STRATA_RETURN_IF_ERROR(CheckOutputPath(path, flag));  // names the flag
  return WriteFileAtomic(path, text);
}

JsonDestination::JsonDestination(std::string path) : path_(std::move(path)) {
  if (path_ != "-") return;
  std::fflush(stdout);
  saved_stdout_ = ::dup(STDOUT_FILENO);
  if (saved_stdout_ >= 0) ::dup2(STDERR_FILENO, STDOUT_FILENO);
}

JsonDestination::~JsonDestination() {
  if (saved_stdout_ < 0) return;
  std::fflush(stdout);
  ::dup2(saved_stdout_, STDOUT_FILENO);
  ::close(saved_stdout_);
}

Status JsonDestination::Write(std::string_view flag, const std::string& text) const {
  if (path_ != "-" || saved_stdout_ < 0) return WriteOutput(flag, path_, text);
  std::fflush(stdout);
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(saved_stdout_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::IOError(std::string(flag) + " -: cannot write to standard output");
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

CLI::Option* AddSwitch(CLI::App* cmd, const std::string& name, bool* value,
                       const std::string& help) {
  CLI::Option* on =
      cmd->add_flag("--" + name, *value, help + (*value ? " (default: on)" : " (default: off)"));
  cmd->add_flag_callback(
      "--no-" + name, [value] { *value = false; }, "Turn --" + name + " off");
  return on;
}

void AddModelThreadsFlag(CLI::App* cmd, int* threads) {
  cmd->add_option("--threads", *threads,
                  "Threads for the model's CPU ops (0: STRATA_NUM_THREADS when set, else one "
                  "per core)")
      ->check(CLI::Range(0, kMaxThreads))
      ->capture_default_str();
}

int ResolveThreads(int flag) {
  if (flag > 0) return flag;
  return EnvNumThreads();
}

void SetComputeThreads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

std::string IoSettingsText(const EngineOptions& eo) {
  return "requests of " + HumanBytes(eo.nvme_stripe_bytes) + ", queue depth " +
         std::to_string(eo.io.queue_depth) + ", " + IoBackendKindName(eo.io.kind) + ", " +
         (eo.io.direct ? "O_DIRECT" : "buffered") +
         (eo.io.fixed_buffers ? ", registered buffers" : "");
}

}  // namespace strata::cli
