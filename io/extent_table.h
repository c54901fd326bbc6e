// ExtentTable: SwapStore's metadata, apart from its I/O. Which version of each key is
// committed (what the manifest on disk names) and which is pending (completed since the last
// commit), or a pending delete; the free ranges of the logical space; the steps committed and
// prepared. SwapStore owns the I/O (backend, operations in flight, completions, data files);
// it asks this table where a write goes and what a read reads, and tells it when they
// finish.
//
// A Version is a range of the logical space plus length and checksum. Ranges come from a
// first-fit free map (RangeAllocator) over the logical space.
//
// When space is freed. A version's range returns to the free map once (a) it is no longer
// named by the table (superseded pending version, failed or out-raced write, or a committed
// version replaced or deleted by a commit that has reached the disk) and (b) no read in
// flight still targets it (Version::readers). (b) matters because a read of version A may
// still be in flight when a newer write replaces A; reusing A's space for a third write
// would let the read see foreign bytes. Committed versions are dropped only after the new
// manifest is durable (FinishCommit), which is what makes re-opening after a crash safe:
// every range the on-disk manifest names is untouched until a later manifest stops naming it.
//
// Not thread-safe: SwapStore's metadata mutex guards it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/manifest.h"
#include "io/range_allocator.h"
#include "strata/status.h"

namespace strata::swap_internal {

struct ExtentVersion {
  uint64_t offset = 0;  // logical
  uint64_t length = 0;
  uint64_t alloc = 0;  // RoundUp(length, 4 KiB): the range held
  uint64_t checksum = 0;
  uint64_t step = 0;
  bool committed = false;
  int readers = 0;       // reads in flight
  bool dropped = false;  // no longer named by the table
  bool freed = false;
};
using VersionPtr = std::shared_ptr<ExtentVersion>;

class ExtentTable {
 public:
  // An empty table over `capacity` bytes of logical space.
  void Reset(uint64_t capacity);
  // Takes the extents `manifest` names as committed. Corruption (naming `manifest_path`)
  // when two extents overlap or a key appears twice.
  Status Load(const Manifest& manifest, const std::string& manifest_path);

  // --- writes ---
  // Space for a new version of `key` (never over the committed one); NoSpace when the
  // logical space has no free range that large.
  Result<VersionPtr> NewVersion(std::string_view key, uint64_t length, uint64_t checksum);
  // Orders the writes and deletes of a key: the one with the larger number wins.
  uint64_t NextSeq() { return ++seq_; }
  // A write completed: `v` becomes the key's pending version unless a later write or delete
  // (seq) already set it.
  void WriteCompleted(const std::string& key, const VersionPtr& v, uint64_t seq);
  // A write failed: its space is freed.
  void WriteFailed(const VersionPtr& v) { Drop(v); }

  // --- reads ---
  // The version a read of `key` targets (the committed one with `committed`), held against
  // reuse until EndRead. NotFound, or InvalidArgument when it is longer than `capacity`.
  Result<VersionPtr> BeginRead(const std::string& key, bool committed, uint64_t capacity);
  void EndRead(const VersionPtr& v);

  // --- pending changes ---
  // NotFound when the key has no visible version.
  Status Delete(std::string_view key);
  // The committed version (or none) is visible again; a pending version's space is freed.
  void Revert(std::string_view key);

  // --- commit ---
  // InvalidArgument when a step is prepared or `step` does not follow the committed one (or,
  // with `restamp`, equal it: a commit that records the store under a new identity).
  Status CheckCanPrepare(uint64_t step, bool restamp = false) const;
  // Every visible extent, as the manifest of `step` names it.
  std::vector<ManifestEntry> ManifestEntries(uint64_t step) const;
  void MarkPrepared(uint64_t step);
  // The prepared step; InvalidArgument when none is or the extents changed since.
  Result<uint64_t> PreparedStep() const;
  void AbortPrepared() { prepared_step_.reset(); }
  // The prepared manifest is durable: pending versions become committed, the versions it no
  // longer names are dropped.
  void FinishCommit(uint64_t step);

  // --- queries ---
  // The visible version of `key`, or null.
  VersionPtr Lookup(std::string_view key) const;
  std::vector<std::string> Keys() const;  // visible keys, sorted
  uint64_t Extents() const;               // visible keys
  std::optional<uint64_t> committed_step() const { return committed_step_; }
  uint64_t in_use() const { return in_use_; }
  uint64_t committed_bytes() const { return committed_bytes_; }
  uint64_t largest_free() const { return ranges_.LargestFree(); }

 private:
  struct Entry {
    VersionPtr committed;
    VersionPtr pending;
    bool deleted = false;  // pending delete
    uint64_t seq = 0;      // seq_ of the write or delete that set the pending state
  };
  static VersionPtr Visible(const Entry& e);
  // The version is no longer named; its range is freed once no read targets it.
  void Drop(const VersionPtr& v);
  void FreeRange(uint64_t offset, uint64_t bytes);

  uint64_t capacity_ = 0;
  std::map<std::string, Entry, std::less<>> entries_;
  RangeAllocator ranges_;  // logical free ranges across the striped files
  uint64_t in_use_ = 0;
  uint64_t committed_bytes_ = 0;
  uint64_t seq_ = 0;
  std::optional<uint64_t> committed_step_;
  std::optional<uint64_t> prepared_step_;  // between PrepareCommit and FinishCommit
  uint64_t prepared_seq_ = 0;              // seq_ at PrepareCommit: nothing may change after
};

}  // namespace strata::swap_internal
