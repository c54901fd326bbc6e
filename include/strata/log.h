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
}  // namespace log_internal

// Replaces the stderr writer (nullptr restores it). Returns nothing; for tests.
inline void SetLogSink(std::function<void(LogLevel, std::string_view)> sink) {
  auto& st = log_internal::GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  st.sink = std::move(sink);
}

inline void Log(LogLevel level, std::string_view message) {
  auto& st = log_internal::GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.sink) {
    st.sink(level, message);
    return;
  }
  if (level > log_internal::Threshold()) return;
  static const char* kPrefix[] = {"error: ", "warning: ", "", "debug: "};
  std::fprintf(stderr, "strata: %s%.*s\n", kPrefix[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}
inline void LogWarning(std::string_view m) { Log(LogLevel::kWarning, m); }
inline void LogDebug(std::string_view m) { Log(LogLevel::kDebug, m); }

}  // namespace strata
