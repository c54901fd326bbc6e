// Messages to the user on stderr ("strata: warning: ..."), filtered by STRATA_LOG_LEVEL.
// Tests may install a sink to capture them. Safe for concurrent use.
#pragma once

#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

#include "strata/env.h"

namespace strata {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

namespace log_internal {
struct State {
  std::mutex mu;
  std::function<void(LogLevel, std::string_view)> sink;
};
inline State& GetState() {
  static State state;
  return state;
}
inline LogLevel Threshold() {
  static const LogLevel level = [] {
    std::string s = EnvGet("STRATA_LOG_LEVEL");
    if (s == "error") return LogLevel::kError;
    if (s == "warning") return LogLevel::kWarning;
    if (s == "debug") return LogLevel::kDebug;
    return LogLevel::kInfo;
  }();
  return level;
}

// The default writer: "strata: warning: ..." on stderr, when `level` passes STRATA_LOG_LEVEL.
inline void WriteToStderr(LogLevel level, std::string_view message) {
  if (level > Threshold()) return;
  static const char* kPrefix[] = {"error: ", "warning: ", "", "debug: "};
  std::fprintf(stderr, "strata: %s%.*s\n", kPrefix[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}
}  // namespace log_internal

// Replaces the writer (nullptr restores stderr's) and returns the one it replaced (nullptr:
// stderr's), so that a caller can pass messages on to it and put it back. A sink is called
// under the log's mutex, one message at a time; after SetLogSink returns, the replaced sink
// is never called again. For tests, and for the CLI's progress lines.
inline std::function<void(LogLevel, std::string_view)> SetLogSink(
    std::function<void(LogLevel, std::string_view)> sink) {
  auto& st = log_internal::GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  std::swap(st.sink, sink);
  return sink;
}

inline void Log(LogLevel level, std::string_view message) {
  auto& st = log_internal::GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.sink) {
    st.sink(level, message);
    return;
  }
  log_internal::WriteToStderr(level, message);
}
inline void LogWarning(std::string_view m) { Log(LogLevel::kWarning, m); }
inline void LogDebug(std::string_view m) { Log(LogLevel::kDebug, m); }

}  // namespace strata
