#include "engine/fault_env.h"

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

#include "strata/fault_injection.h"

namespace strata::engine_internal {

std::function<void(std::string_view)> KillHookFromEnvironment() {
  const char* spec = std::getenv("STRATA_TEST_KILL_AT");
  if (spec == nullptr) return nullptr;
  const std::string text = spec;
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return nullptr;
  const std::string point = text.substr(0, colon);
  const long n = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  if (n < 1) return nullptr;
  auto seen = std::make_shared<long>(0);
  return [point, n, seen](std::string_view at) {
    if (at == point && ++*seen == n) ::raise(SIGKILL);
  };
}

Result<IoBackendFactory> FaultsFromEnvironment(IoBackendFactory factory) {
  const char* spec = std::getenv("STRATA_TEST_FAULT");
  if (spec == nullptr || *spec == '\0') return factory;
  FaultInjectionOptions faults;
  const std::string text = spec;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const size_t at = item.find('@');
    const std::string kind = item.substr(0, at);
    const uint64_t n =
        at == std::string::npos ? 0 : std::strtoull(item.c_str() + at + 1, nullptr, 10);
    uint64_t* field = kind == "eio_read"       ? &faults.eio_read_at
                      : kind == "eio_write"    ? &faults.eio_write_at
                      : kind == "enospc_write" ? &faults.enospc_write_at
                      : kind == "short_write"  ? &faults.short_write_at
                      : kind == "flip_read"    ? &faults.flip_read_at
                      : kind == "flip_write"   ? &faults.flip_write_at
                      : kind == "sync_eio"     ? &faults.sync_eio_at
                                               : nullptr;
    if (field == nullptr || n == 0) {
      return Status::InvalidArgument(
          "STRATA_TEST_FAULT=" + text + ": '" + item +
          "' is not KIND@N with N >= 1 and KIND one of eio_read, eio_write, enospc_write, "
          "short_write, flip_read, flip_write, sync_eio");
    }
    *field = n;
    pos = end + 1;
  }
  return IoBackendFactory(
      [factory, faults](const IoBackendOptions& options) -> Result<std::unique_ptr<IoBackend>> {
        std::unique_ptr<IoBackend> inner;
        if (factory) {
          STRATA_ASSIGN_OR_RETURN(inner, factory(options));
        } else {
          STRATA_ASSIGN_OR_RETURN(inner, CreateIoBackend(options));
        }
        return CreateFaultInjectionBackend(std::move(inner), faults);
      });
}

}  // namespace strata::engine_internal
