// The STRATA_* environment variables: every tunable read from the environment is declared
// here, once, with its default and its meaning (`strata env` prints this table).
// Thread-safe: reads only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace strata {

struct EnvVar {
  const char* name;
  const char* default_value;
  const char* help;
  bool secret = false;  // `strata env` shows whether it is set, never its value
};

inline constexpr EnvVar kEnvVars[] = {
    {"STRATA_CPU_ISA", "auto",
     "CPU kernels' instruction set: auto (best the CPU has), avx512, avx2 or scalar"},
    {"STRATA_IO_BACKEND", "auto",
     "NVMe I/O backend: auto (io_uring, else pread/pwrite), uring or posix"},
    {"STRATA_NUM_THREADS", "0", "threads for CPU kernels; 0 = one per core; at most 1024"},
    {"STRATA_TEST_SEED", "", "seed of the property tests; empty = from the clock (printed)"},
    {"STRATA_LOG_LEVEL", "info", "stderr messages: error, warning, info or debug"},
    {"STRATA_RENDEZVOUS", "",
     "where ranks meet: file:DIR (shared folder) or redis://HOST:PORT/PREFIX"},
    {"STRATA_COMM_TIMEOUT", "300", "seconds a collective may wait for a peer before failing"},
    {"STRATA_CUDA_KERNELS", "default",
     "CUDA GPT-2 kernels: default (per family the newest variant that has passed on a GPU, "
     "see below), tuned (every tuned kernel), naive (the previous ones), or a list such as "
     "attention=tuned,classifier=naive or attention=flash (attention, embedding, classifier, "
     "matmul, elementwise)"},
    {"STRATA_COMM_HOST", "", "Gloo listen address; empty: 127.0.0.1 on one host, else hostname"},
    {"STRATA_REDIS_PASSWORD", "",
     "password of a redis:// rendezvous (AUTH) when its URL gives none; keeps it out of ps", true},
    {"STRATA_RUN_SECRET", "",
     "the run's secret: every rank signs its rendezvous keys with it (HMAC-SHA256) and "
     "ignores keys that do not verify; strata launch makes one (--run-secret)",
     true},
    {"STRATA_LAUNCH_COMMAND", "",
     "set by strata launch for its ranks: its own command (strata launch -n N --), which the "
     "resume command of an interrupted run starts with"},
    {"STRATA_LAUNCH_COMMAND_HAD_SECRET", "",
     "set (1) by strata launch for its ranks when its command had a --run-secret, which "
     "STRATA_LAUNCH_COMMAND leaves out: the resume hint says to give the secret again"},
};

// The variable's value, or its declared default when unset or empty.
// REQUIRES: `name` is declared in kEnvVars (else returns "").
inline std::string EnvGet(std::string_view name) {
  for (const EnvVar& v : kEnvVars) {
    if (name == v.name) {
      const char* set = std::getenv(v.name);
      return (set && *set) ? std::string(set) : std::string(v.default_value);
    }
  }
  return {};
}

inline int64_t EnvGetInt(std::string_view name) {
  std::string s = EnvGet(name);
  return s.empty() ? 0 : std::strtoll(s.c_str(), nullptr, 10);
}

// The most threads STRATA_NUM_THREADS (and --threads) may ask for.
inline constexpr int kMaxCpuThreads = 1024;

// STRATA_NUM_THREADS, bounded: 0 when unset or not positive, at most kMaxCpuThreads (the
// front ends refuse a larger value by name before anything runs; see EnvNumThreadsError).
inline int EnvNumThreads() {
  const int64_t n = EnvGetInt("STRATA_NUM_THREADS");
  return n <= 0 ? 0 : static_cast<int>(n < kMaxCpuThreads ? n : kMaxCpuThreads);
}

// A message naming STRATA_NUM_THREADS when it asks for more than kMaxCpuThreads; "" else.
inline std::string EnvNumThreadsError() {
  const int64_t n = EnvGetInt("STRATA_NUM_THREADS");
  if (n <= kMaxCpuThreads) return {};
  return "STRATA_NUM_THREADS=" + EnvGet("STRATA_NUM_THREADS") + ": at most " +
         std::to_string(kMaxCpuThreads) + " threads; unset it or give fewer";
}

}  // namespace strata
