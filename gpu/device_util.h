// Helpers shared by the Device implementations (HostDevice, CudaDevice): the budget check and
// its OutOfMemory message, so both devices refuse an allocation with the same wording.
// Stateless; safe for concurrent use.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/bytes.h"
#include "strata/status.h"

namespace strata::gpu_internal {

// The refusal of an allocation that would exceed the budget; names the budget, the bytes in
// use and the request, and what the user can do about it.
inline Status BudgetExceeded(std::string_view device, uint64_t request, uint64_t in_use,
                             uint64_t budget) {
  return Status::OutOfMemory(std::string(device) + ": cannot allocate " +
                             FormatBytesExact(request) + ": the device memory budget is " +
                             FormatBytesExact(budget) + " and " + FormatBytesExact(in_use) +
                             " are in use, " +
                             FormatBytesExact(budget > in_use ? budget - in_use : 0) +
                             " free; raise the device memory budget or free device memory first");
}

// Rounds up to the allocation alignment every Device guarantees.
inline constexpr uint64_t kDeviceAlignment = 256;

}  // namespace strata::gpu_internal
