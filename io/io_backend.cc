// The parts of IoBackend shared by every implementation: the synchronous convenience call,
// the factory that picks io_uring or the posix fallback, and kind names.
#include <atomic>
#include <string>
#include <vector>

#include "io/posix_backend.h"
#include "io/uring_backend.h"
#include "strata/env.h"
#include "strata/io.h"
#include "strata/log.h"

namespace strata {

Status IoBackend::RunSync(std::span<const IoRequest> requests) {
  STRATA_RETURN_IF_ERROR(Submit(requests));
  Status first;
  std::vector<IoCompletion> out(std::min<size_t>(requests.size(), 256) + 1);
  size_t remaining = requests.size();
  while (remaining > 0) {
    STRATA_ASSIGN_OR_RETURN(size_t n, Poll(std::span<IoCompletion>(out), 1));
    for (size_t i = 0; i < n; ++i) {
      if (first.ok() && !out[i].status.ok()) first = out[i].status;
    }
    remaining -= std::min(n, remaining);
  }
  return first;
}

Result<IoBackendKind> ParseIoBackendKind(std::string_view name) {
  if (name == "auto") return IoBackendKind::kAuto;
  if (name == "uring" || name == "io_uring") return IoBackendKind::kUring;
  if (name == "posix") return IoBackendKind::kPosix;
  return Status::InvalidArgument("unknown I/O backend '" + std::string(name) +
                                 "'; use auto, uring or posix");
}

const char* IoBackendKindName(IoBackendKind kind) {
  switch (kind) {
    case IoBackendKind::kAuto:
      return "auto";
    case IoBackendKind::kUring:
      return "uring";
    case IoBackendKind::kPosix:
      return "posix";
  }
  return "unknown";
}

Result<std::unique_ptr<IoBackend>> CreateIoBackend(const IoBackendOptions& options) {
  if (options.queue_depth == 0) {
    return Status::InvalidArgument(
        "I/O queue depth 0 is invalid: at least one request must be in flight; use 1 or more "
        "(32 is a good default for NVMe)");
  }
  IoBackendOptions opts = options;
  if (opts.kind == IoBackendKind::kAuto) {
    // The environment only refines "auto": an explicit choice in code or on the command
    // line wins over it.
    const std::string env = EnvGet("STRATA_IO_BACKEND");
    Result<IoBackendKind> kind = ParseIoBackendKind(env);
    if (!kind.ok()) {
      return Status::InvalidArgument("STRATA_IO_BACKEND=" + env +
                                     " is not a backend; use auto, uring or posix");
    }
    opts.kind = *kind;
  }
  if (opts.kind == IoBackendKind::kPosix) {
    STRATA_ASSIGN_OR_RETURN(auto posix, PosixBackend::Create(opts));
    return std::unique_ptr<IoBackend>(std::move(posix));
  }
  Result<std::unique_ptr<UringBackend>> uring = UringBackend::Create(opts);
  if (uring.ok()) return std::unique_ptr<IoBackend>(std::move(uring).value());
  if (opts.kind == IoBackendKind::kUring || !uring.status().IsNotSupported()) {
    return uring.status();
  }
  // kAuto and io_uring is unavailable on this kernel: the posix pool does the same work
  // with more CPU per request. Say so once per process: every backend would repeat it.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    LogWarning(uring.status().message() + "; using the pread/pwrite backend instead");
  }
  STRATA_ASSIGN_OR_RETURN(auto posix, PosixBackend::Create(opts));
  return std::unique_ptr<IoBackend>(std::move(posix));
}

}  // namespace strata
