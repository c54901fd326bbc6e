#include "io/swap_layout.h"

#include <algorithm>

#include "io/manifest.h"
#include "io/swap_store.h"
#include "strata/bytes.h"

namespace strata::swap_internal {

namespace {

constexpr uint64_t kBlock = kIoAlignment;
constexpr uint64_t kDefaultStripe = 1 << 20;

}  // namespace

Result<SwapLayout> SwapLayout::Resolve(const SwapStoreOptions& options, const Manifest* manifest,
                                       uint64_t files, const std::string& folder0) {
  SwapLayout l;
  l.files = files;
  if (manifest) {
    if (manifest->num_paths != files) {
      return Status::InvalidArgument("swap store in " + folder0 + " was created over " +
                                     std::to_string(manifest->num_paths) + " folder(s) but " +
                                     std::to_string(files) +
                                     " were given; give the same folders in the same order");
    }
    if (options.stripe_bytes != 0 && options.stripe_bytes != manifest->stripe_bytes) {
      return Status::InvalidArgument("swap store in " + folder0 + " uses a stripe of " +
                                     std::to_string(manifest->stripe_bytes) + " bytes, not " +
                                     std::to_string(options.stripe_bytes) +
                                     "; pass 0 to keep the stored stripe");
    }
    l.stripe = manifest->stripe_bytes;
    l.capacity =
        options.capacity_bytes ? RoundUp(options.capacity_bytes, kBlock) : manifest->capacity_bytes;
    if (options.capacity_bytes == 0 && options.max_capacity_bytes != 0) {
      // The stored capacity is only trusted up to what the caller allows, and never below
      // what the committed extents need.
      uint64_t committed_end = 0;
      for (const ManifestEntry& e : manifest->entries) {
        if (e.offset > l.capacity || RoundUp(e.length, kBlock) > l.capacity - e.offset) continue;
        committed_end = std::max(committed_end, e.offset + RoundUp(e.length, kBlock));
      }
      l.capacity = std::min(l.capacity,
                            std::max(RoundUp(options.max_capacity_bytes, kBlock), committed_end));
    }
    for (const ManifestEntry& e : manifest->entries) {
      if (e.offset + RoundUp(e.length, kBlock) > l.capacity) {
        return Status::InvalidArgument(
            "swap capacity " + std::to_string(l.capacity) +
            " bytes is smaller than the committed extent '" + e.key + "' (ends at " +
            std::to_string(e.offset + RoundUp(e.length, kBlock)) + "); give a larger capacity");
      }
    }
  } else {
    if (options.capacity_bytes == 0) {
      return Status::InvalidArgument(
          "swap store: capacity is 0 bytes; give the bytes of "
          "extent space the store needs");
    }
    l.stripe = options.stripe_bytes ? options.stripe_bytes : kDefaultStripe;
    l.capacity = RoundUp(options.capacity_bytes, kBlock);
  }

  const uint64_t stripes = (l.capacity + l.stripe - 1) / l.stripe;
  l.file_bytes = (stripes + files - 1) / files * l.stripe;
  return l;
}

void SwapLayout::Map(uint64_t offset, uint64_t length, std::vector<SwapChunk>* out) const {
  while (length > 0) {
    const uint64_t s = offset / stripe;
    const uint64_t within = offset % stripe;
    const uint64_t len = std::min(stripe - within, length);
    out->push_back(SwapChunk{static_cast<uint32_t>(s % files), (s / files) * stripe + within, len});
    offset += len;
    length -= len;
  }
}

std::vector<uint64_t> SwapLayout::NeededEnds(const Manifest& manifest) const {
  std::vector<uint64_t> end(files, 0);
  std::vector<SwapChunk> chunks;
  for (const ManifestEntry& e : manifest.entries) {
    chunks.clear();
    Map(e.offset, RoundUp(e.length, kBlock), &chunks);
    for (const SwapChunk& c : chunks) end[c.path] = std::max(end[c.path], c.file_offset + c.length);
  }
  return end;
}

}  // namespace strata::swap_internal
