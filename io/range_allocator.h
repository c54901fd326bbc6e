// RangeAllocator: first-fit allocation of [offset, offset+length) ranges out of a fixed
// capacity, with freed ranges merged into their neighbours.
//
// One implementation serves every place that hands out ranges: the PinnedPool (offsets
// into its arena), the SwapStore (logical offsets across its striped files) and the
// engine's planner, which replays the pinned pool's allocations to predict fragmentation —
// so what the planner predicts is exactly what the pool will do.
//
// First fit keeps the lowest free offset that fits, so a sequence of calls is
// deterministic. Sizes are taken as given (callers round them to their alignment).
// Not thread-safe: the owner guards it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

namespace strata {

class RangeAllocator {
 public:
  RangeAllocator() = default;
  explicit RangeAllocator(uint64_t capacity) { Reset(capacity); }

  // Forgets every allocation: the whole capacity is one free range.
  void Reset(uint64_t capacity) {
    free_.clear();
    capacity_ = capacity;
    in_use_ = 0;
    if (capacity > 0) free_.emplace(0, capacity);
  }

  // The lowest offset of a free range of `length` bytes, now taken; nullopt when no free
  // range is that long. REQUIRES: length > 0.
  std::optional<uint64_t> Allocate(uint64_t length) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < length) continue;
      const uint64_t offset = it->first;
      const uint64_t rest = it->second - length;
      free_.erase(it);
      if (rest > 0) free_.emplace(offset + length, rest);
      in_use_ += length;
      return offset;
    }
    return std::nullopt;
  }

  // Takes exactly [offset, offset+length) (e.g. an extent named by a manifest). False, and
  // nothing changes, when any part of it is not free. REQUIRES: length > 0.
  bool Claim(uint64_t offset, uint64_t length) {
    auto it = free_.upper_bound(offset);
    if (it == free_.begin()) return false;
    --it;
    const uint64_t start = it->first, end = it->first + it->second;
    if (end < offset + length) return false;
    free_.erase(it);
    if (offset > start) free_.emplace(start, offset - start);
    if (end > offset + length) free_.emplace(offset + length, end - (offset + length));
    in_use_ += length;
    return true;
  }

  // Returns [offset, offset+length) to the free ranges, merging it with free neighbours.
  // REQUIRES: the range was allocated or claimed and is not free already.
  void Free(uint64_t offset, uint64_t length) {
    if (length == 0) return;
    in_use_ -= length;
    uint64_t start = offset, end = offset + length;
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == end) {
      end += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        free_.erase(prev);
      }
    }
    free_.emplace(start, end - start);
  }

  uint64_t capacity() const { return capacity_; }
  uint64_t in_use() const { return in_use_; }
  uint64_t LargestFree() const {
    uint64_t largest = 0;
    for (const auto& [offset, length] : free_) largest = std::max(largest, length);
    return largest;
  }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> length; never two adjacent ranges
  uint64_t capacity_ = 0;
  uint64_t in_use_ = 0;
};

}  // namespace strata
