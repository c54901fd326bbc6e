// The SwapStore manifest: which extent key lives where, as of the last committed step.
//
// The manifest is the only metadata a SwapStore persists; the data files are plain striped
// address space. It is written whole, to a temporary file that is fsync'd and renamed over
// the previous one (see SwapStore::Commit), so a reader sees either the old or the new
// manifest, never a mix. Its trailing XXH3-64 also catches a torn or damaged file.
//
// Binary layout (little-endian, no padding):
//   "STRATAMF" magic (8 bytes), u32 format version (1 or 2), u32 number of paths,
//   u64 stripe bytes, u64 capacity bytes, u64 flags (bit 0: `step` is valid), u64 step,
//   [version 2 only: u32 run-identity length (1 to 256), its bytes,]
//   u64 number of entries, then per entry:
//     u32 key length, key bytes, u64 logical offset, u64 length, u64 XXH3-64 of the
//     extent's `length` bytes, u64 step of the commit that made this version durable,
//   then u64 XXH3-64 of every byte before it.
//
// Version 2 carries the identity of the run that created the store (SwapStoreOptions::
// run_id); a manifest without one is written, and read, as version 1 (the format of stores
// made before identities existed).
//
// Plain functions over values; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::swap_internal {

struct ManifestEntry {
  std::string key;
  uint64_t offset = 0;    // in the store's logical (striped) address space; 4 KiB-aligned
  uint64_t length = 0;    // logical bytes (the space taken is length rounded up to 4 KiB)
  uint64_t checksum = 0;  // XXH3-64 of the logical bytes
  uint64_t step = 0;      // commit that made this version durable
};

struct Manifest {
  uint32_t num_paths = 0;
  uint64_t stripe_bytes = 0;
  uint64_t capacity_bytes = 0;
  std::optional<uint64_t> step;  // none before the first Commit
  std::string run_id;            // the creating run's identity; "" = none (version 1)
  std::vector<ManifestEntry> entries;
};

inline constexpr size_t kMaxRunIdBytes = 256;

// XXH3-64, the checksum of extents and of the manifest.
uint64_t Checksum64(const void* data, size_t length);

std::string EncodeManifest(const Manifest& manifest);
// Corruption naming `path` when the bytes are truncated, carry a bad magic, version or
// checksum, a run identity of 0 or more than kMaxRunIdBytes bytes, or describe entries
// that do not fit the stated capacity.
Result<Manifest> DecodeManifest(std::string_view bytes, const std::string& path);

}  // namespace strata::swap_internal
