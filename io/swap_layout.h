// SwapLayout: the swap store's geometry, fixed at Open: the stripe, the logical capacity,
// the number of data files and each file's size, and how a logical range maps onto the
// files (logical stripe s lives in file s % n at offset (s / n) * stripe). A new store takes
// it from SwapStoreOptions; an existing one from its manifest, checked against the options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata {
struct SwapStoreOptions;
}

namespace strata::swap_internal {

struct Manifest;

// One piece of a logical range in one data file.
struct SwapChunk {
  uint32_t path;
  uint64_t file_offset;
  uint64_t length;
};

struct SwapLayout {
  uint64_t stripe = 0;
  uint64_t capacity = 0;  // logical bytes, a multiple of 4 KiB
  uint64_t files = 0;
  uint64_t file_bytes = 0;  // each data file's preallocated size

  // The layout of a store opened with `options` over `files` folders, from its committed
  // `manifest` (nullptr: a new store). InvalidArgument naming `folder0` when the manifest
  // was made over other folders or another stripe, when the capacity asked for is 0 (a new
  // store), or when a committed extent lies beyond the capacity. An existing store's stored
  // capacity is trusted only up to options.max_capacity_bytes (never below the extents).
  static Result<SwapLayout> Resolve(const SwapStoreOptions& options, const Manifest* manifest,
                                    uint64_t files, const std::string& folder0);

  // Splits logical [offset, offset + length) into per-file pieces (appended to `out`).
  void Map(uint64_t offset, uint64_t length, std::vector<SwapChunk>* out) const;
  // Per file, the end of the last byte the manifest's extents occupy.
  std::vector<uint64_t> NeededEnds(const Manifest& manifest) const;
};

}  // namespace strata::swap_internal
