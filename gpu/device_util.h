// Helpers shared by the Device implementations (HostDevice, CudaDevice): the budget check and
// its OutOfMemory message, so both devices refuse an allocation with the same wording, and the
// set of adopted ranges (Device::AdoptMemory). The functions are stateless; an AdoptedRanges
// is guarded by its device's memory mutex.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

// Memory a device uses for copies without owning it (Device::AdoptMemory). Few ranges live at
// once (the gradients of the blocks whose landing is pending), so a linear scan is enough.
class AdoptedRanges {
 public:
  void Add(const void* ptr, uint64_t bytes) {
    ranges_.push_back({reinterpret_cast<uintptr_t>(ptr), bytes});
  }
  // Removes one adoption of `ptr`; false when there is none.
  bool Remove(const void* ptr) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (size_t i = 0; i < ranges_.size(); ++i) {
      if (ranges_[i].start == p) {
        ranges_[i] = ranges_.back();
        ranges_.pop_back();
        return true;
      }
    }
    return false;
  }
  // [ptr, ptr+bytes) lies inside one adopted range.
  bool Contains(const void* ptr, uint64_t bytes) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (const Range& r : ranges_) {
      if (p >= r.start && p - r.start <= r.bytes && bytes <= r.bytes - (p - r.start)) return true;
    }
    return false;
  }

 private:
  struct Range {
    uintptr_t start;
    uint64_t bytes;
  };
  std::vector<Range> ranges_;
};

}  // namespace strata::gpu_internal
