// Helpers shared by the Device implementations (HostDevice, CudaDevice): the budget check and
// its OutOfMemory message, so both devices refuse an allocation with the same wording.
// Stateless; safe for concurrent use.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata::gpu_internal {

// "1048583 bytes (1.00 MiB)": exact figure for scripts, rounded one for people.
inline std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  std::string s = std::to_string(bytes) + " bytes";
  if (bytes < 1024) return s;
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024.0 && unit < 3) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), " (%.2f %s)", v, kUnits[unit]);
  return s + buf;
}

// The refusal of an allocation that would exceed the budget; names the budget, the bytes in
// use and the request, and what the user can do about it.
inline Status BudgetExceeded(std::string_view device, uint64_t request, uint64_t in_use,
                             uint64_t budget) {
  return Status::OutOfMemory(std::string(device) + ": cannot allocate " + FormatBytes(request) +
                             ": the device memory budget is " + FormatBytes(budget) + " and " +
                             FormatBytes(in_use) + " are in use (" +
                             FormatBytes(budget > in_use ? budget - in_use : 0) +
                             " free); raise the device memory budget or free device memory first");
}

// Rounds up to the allocation alignment every Device guarantees.
inline constexpr uint64_t kDeviceAlignment = 256;
inline uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace strata::gpu_internal
