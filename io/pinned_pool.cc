// PinnedPool allocator.
//
// Overview: the arena is [base_, base_ + size_). Free space is a map offset -> length of
// disjoint, non-adjacent ranges (address order); live allocations are a map offset ->
// {length, owner}. All lengths and offsets are multiples of 4 KiB, so every allocation is
// page-aligned (the arena itself comes from mmap).
//
// Allocate: first fit — walk the free ranges in address order and take the front of the
// first one long enough; the rest stays free. First fit keeps long-lived buffers (allocated
// first) low in the arena and is O(free ranges), which stays small because the engine
// allocates a few hundred buffers, not millions.
// Free: the range is inserted back and merged with the free range that ends where it starts
// and the one that starts where it ends, so the free map never holds two adjacent ranges
// and a fully freed pool is one range again.
//
// Accounting: in_use_ is the sum of live allocation lengths (the budget is charged rounded
// bytes, since that is what is unavailable to others), peak_ its maximum, owner_bytes_ the
// per-tag split. All state is guarded by mu_; no I/O or syscall happens under it.
#include "io/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "strata/bytes.h"
#include "strata/log.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;

std::string MemlockAdvice(uint64_t bytes, int err) {
  struct rlimit rl {};
  std::string limit = "unknown";
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    limit = rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : FormatBytesExact(rl.rlim_cur);
  }
  return "cannot lock " + FormatBytesExact(bytes) +
         " of pinned memory (mlock: " + std::strerror(err) + "); RLIMIT_MEMLOCK is " + limit +
         ". Raise it: `ulimit -l unlimited` in the shell that starts strata, a line "
         "`<user> - memlock unlimited` in /etc/security/limits.conf (then log in again), "
         "or LimitMEMLOCK=infinity in the systemd unit; or lower the pinned budget";
}

}  // namespace

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (pool_ != nullptr && data_ != nullptr) {
    Status s = pool_->Free(data_);
    (void)s;  // cannot fail: the buffer owns a live allocation of pool_
  }
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(const PinnedPoolOptions& options) {
  if (options.budget_bytes == 0) {
    return Status::InvalidArgument("pinned pool budget is 0 bytes; give a budget > 0");
  }
  const uint64_t size = RoundUp(options.budget_bytes, kPage);
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    return Status::OutOfMemory("cannot map a pinned pool of " + FormatBytesExact(size) +
                               " (mmap: " + std::strerror(err) +
                               "); lower the pinned budget or free host memory")
        .WithErrno(err);
  }
  bool locked = false;
  if (options.lock) {
    if (mlock(base, size) == 0) {
      locked = true;
    } else {
      int err = errno;
      std::string advice = MemlockAdvice(size, err);
      if (options.require_locked) {
        munmap(base, size);
        return Status::OutOfMemory(advice).WithErrno(err);
      }
      LogWarning(advice +
                 "; continuing with unlocked memory (it may be paged out, and "
                 "device copies from it are slower)");
    }
  }
  return std::unique_ptr<PinnedPool>(new PinnedPool(base, size, locked));
}

PinnedPool::PinnedPool(void* base, size_t size, bool locked)
    : base_(base), size_(size), locked_(locked), ranges_(size) {}

PinnedPool::~PinnedPool() {
  if (locked_) munlock(base_, size_);
  munmap(base_, size_);
}

bool PinnedPool::Contains(const void* ptr, uint64_t bytes) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  auto b = reinterpret_cast<uintptr_t>(base_);
  return p >= b && bytes <= size_ && p - b <= size_ - bytes;
}

std::string PinnedPool::DescribeUseLocked(size_t top_owners) const {
  const uint64_t largest = ranges_.LargestFree();
  std::string s = "in use " + FormatBytesExact(in_use_) + " of a budget of " +
                  FormatBytesExact(size_) + " by " + std::to_string(allocated_.size()) +
                  " allocation(s); largest free range " + FormatBytesExact(largest);
  std::vector<std::pair<std::string, uint64_t>> owners(owner_bytes_.begin(), owner_bytes_.end());
  std::sort(owners.begin(), owners.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (!owners.empty()) {
    s += "; top owners:";
    for (size_t i = 0; i < owners.size() && i < top_owners; ++i) {
      s += (i ? ", " : " ") + owners[i].first + " " + FormatBytesExact(owners[i].second);
    }
    if (owners.size() > top_owners) {
      s += ", and " + std::to_string(owners.size() - top_owners) + " more";
    }
  }
  return s;
}

Result<void*> PinnedPool::Allocate(uint64_t bytes, std::string_view owner) {
  const uint64_t need = RoundUp(std::max<uint64_t>(bytes, 1), kPage);
  std::lock_guard<std::mutex> lock(mu_);
  if (std::optional<uint64_t> found = ranges_.Allocate(need)) {
    const uint64_t off = *found;
    allocated_.emplace(off, Allocation{need, std::string(owner)});
    auto ob = owner_bytes_.find(owner);
    if (ob == owner_bytes_.end()) ob = owner_bytes_.emplace(std::string(owner), 0).first;
    ob->second += need;
    in_use_ += need;
    peak_ = std::max(peak_, in_use_);
    return static_cast<void*>(static_cast<char*>(base_) + off);
  }
  std::string why = in_use_ + need <= size_ ? " (enough bytes are free, but fragmented)" : "";
  return Status::OutOfMemory("pinned pool cannot allocate " + FormatBytesExact(need) + " for '" +
                             std::string(owner) + "'" + why + ": " + DescribeUseLocked(5) +
                             ". Raise the pinned budget or lower prefetch depth / buffer "
                             "sizes");
}

Result<PinnedBuffer> PinnedPool::AllocateBuffer(uint64_t bytes, std::string_view owner) {
  STRATA_ASSIGN_OR_RETURN(void* p, Allocate(bytes, owner));
  uint64_t size = RoundUp(std::max<uint64_t>(bytes, 1), kPage);
  return PinnedBuffer(this, p, size);
}

Status PinnedPool::Free(void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  auto b = reinterpret_cast<uintptr_t>(base_);
  if (ptr == nullptr || p < b || p >= b + size_) {
    return Status::InvalidArgument("PinnedPool::Free: pointer is not inside the pool's arena");
  }
  const uint64_t off = p - b;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(off);
  if (it == allocated_.end()) {
    return Status::InvalidArgument("PinnedPool::Free: offset " + std::to_string(off) +
                                   " is not a live allocation (double free?)");
  }
  const uint64_t len = it->second.size;
  auto ob = owner_bytes_.find(it->second.owner);
  ob->second -= len;
  if (ob->second == 0) owner_bytes_.erase(ob);
  in_use_ -= len;
  allocated_.erase(it);

  ranges_.Free(off, len);
  return Status::OK();
}

Status PinnedPool::RegisterWith(IoBackend& backend) const {
  BufferRegion region{base_, size_};
  return backend.RegisterBuffers(std::span<const BufferRegion>(&region, 1));
}

PinnedPoolStats PinnedPool::Stats() const {
  PinnedPoolStats s;
  std::lock_guard<std::mutex> lock(mu_);
  s.budget_bytes = size_;
  s.in_use_bytes = in_use_;
  s.peak_bytes = peak_;
  s.allocations = allocated_.size();
  s.largest_free_bytes = ranges_.LargestFree();
  s.locked = locked_;
  s.owners.assign(owner_bytes_.begin(), owner_bytes_.end());
  std::sort(s.owners.begin(), s.owners.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return s;
}

void PinnedPool::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

}  // namespace strata
