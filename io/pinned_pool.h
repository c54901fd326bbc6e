// PinnedPool: one budgeted, page-aligned, locked arena of host memory from which every
// staging buffer of the swap path is carved (NVMe <-> host <-> device).
//
// Why one arena: pinned memory is a scarce, machine-wide resource. Allocating it piecemeal
// (one cudaHostAlloc per tensor, as DeepSpeed does) fails late, with an OOM kill, and cannot
// be registered once with io_uring or CUDA. The pool maps its whole budget up front (mmap),
// locks it (mlock), and hands out 4 KiB-aligned pieces, so a run that cannot fit is told so
// at start-up and every later allocation is checked against the same fixed budget.
//
// Locking: when mlock fails (RLIMIT_MEMLOCK lower than the budget and no CAP_IPC_LOCK) the
// pool logs one warning naming the limit and how to raise it (`ulimit -l`, limits.conf,
// systemd LimitMEMLOCK=) and continues with unlocked memory, unless
// PinnedPoolOptions::require_locked asks for a hard failure instead. locked() tells which.
//
// Registration: RegisterWith(backend) registers the arena with an IoBackend (io_uring
// fixed buffers); do it once per backend. CUDA registration is done by whoever owns the
// Device: device.RegisterHostMemory(pool.base(), pool.size()), and
// UnregisterHostMemory(pool.base()) before the pool is destroyed.
//
// Ownership: the pool owns the arena; pointers from Allocate are valid until Free or the
// pool's destruction. The pool never frees an allocation on its own. Destroying the pool
// with live allocations is allowed (the arena is unmapped; the pointers dangle).
//
// Thread safety: every method may be called from any thread; allocation state is guarded
// by one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/range_allocator.h"
#include "strata/io.h"
#include "strata/status.h"

namespace strata {

struct PinnedPoolOptions {
  // Total bytes of the arena; rounded up to whole 4 KiB pages. Must be > 0.
  uint64_t budget_bytes = 0;
  // mlock the arena. false: plain (pageable) memory, no warning.
  bool lock = true;
  // When locking fails: true = Create fails with OutOfMemory (with the same advice);
  // false (default) = one warning, then unlocked memory.
  bool require_locked = false;
};

// Accounting snapshot. All byte counts are of reserved bytes (requests rounded up to 4 KiB),
// which is what the budget is charged.
struct PinnedPoolStats {
  uint64_t budget_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;          // highest in_use since creation or ResetPeak()
  uint64_t allocations = 0;         // live allocations
  uint64_t largest_free_bytes = 0;  // largest contiguous free range
  bool locked = false;
  // Bytes in use per owner tag, largest first.
  std::vector<std::pair<std::string, uint64_t>> owners;
};

class PinnedPool;

// An allocation that frees itself. Movable, not copyable. Must not outlive its pool.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // Bytes reserved (the request rounded up to 4 KiB); all of them are usable.
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Frees now (no-op when empty).
  void Reset();

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, void* data, uint64_t size)
      : pool_(pool), data_(data), size_(size) {}
  PinnedPool* pool_ = nullptr;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

class PinnedPool {
 public:
  // Maps (and locks, see above) the arena. InvalidArgument for a zero budget; OutOfMemory
  // when mmap fails or when require_locked is set and mlock fails, naming the bytes and
  // RLIMIT_MEMLOCK.
  static Result<std::unique_ptr<PinnedPool>> Create(const PinnedPoolOptions& options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Reserves RoundUp(max(bytes, 1), 4096) bytes, 4 KiB-aligned, charged to `owner` (a tag
  // for accounting and error messages, e.g. "prefetch" or "block3/exp_avg"). OutOfMemory
  // when the budget cannot hold it, saying the request, the bytes in use, the largest free
  // range (fragmentation) and the top owners. Memory content is unspecified.
  Result<void*> Allocate(uint64_t bytes, std::string_view owner);
  // Same, as a buffer that frees itself.
  Result<PinnedBuffer> AllocateBuffer(uint64_t bytes, std::string_view owner);
  // Returns an allocation. InvalidArgument (nothing changes) for a pointer that is not a
  // live allocation of this pool, including a double free.
  Status Free(void* ptr);

  // The arena, for RegisterHostMemory / RegisterBuffers.
  void* base() const { return base_; }
  size_t size() const { return size_; }
  bool locked() const { return locked_; }
  // True when [ptr, ptr+bytes) lies inside the arena.
  bool Contains(const void* ptr, uint64_t bytes) const;

  // Registers the whole arena with `backend` (io_uring fixed buffers). Returns the
  // backend's error, if any.
  Status RegisterWith(IoBackend& backend) const;

  PinnedPoolStats Stats() const;
  void ResetPeak();

 private:
  PinnedPool(void* base, size_t size, bool locked);
  std::string DescribeUseLocked(size_t top_owners) const;

  void* const base_;
  const size_t size_;
  const bool locked_;

  mutable std::mutex mu_;
  RangeAllocator ranges_;  // free ranges of the arena (first fit, merged on free)
  struct Allocation {
    uint64_t size;
    std::string owner;
  };
  std::map<uint64_t, Allocation> allocated_;  // by offset
  std::map<std::string, uint64_t, std::less<>> owner_bytes_;
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;
};

}  // namespace strata
