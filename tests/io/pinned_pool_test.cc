// PinnedPool: page-aligned allocations inside one fixed budget, exact accounting per owner,
// actionable OutOfMemory messages, the RLIMIT_MEMLOCK fallback, and registration with a
// real io_uring backend.
#include "io/pinned_pool.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/swap_store.h"
#include "io_test_util.h"
#include "strata/log.h"

namespace strata {
namespace {

using testing::TempDir;
using testing::TestSeed;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

std::unique_ptr<PinnedPool> MustCreate(uint64_t budget, bool lock = true) {
  PinnedPoolOptions o;
  o.budget_bytes = budget;
  o.lock = lock;
  auto r = PinnedPool::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(PinnedPoolTest, AllocationsAreAlignedInsideTheArenaAndAccounted) {
  auto pool = MustCreate(256 * kKiB);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->size(), 256 * kKiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->base()) % 4096, 0u);
  struct Case {
    uint64_t bytes;
    uint64_t charged;
    const char* owner;
  };
  const Case cases[] = {{0, 4096, "a"},    {1, 4096, "a"},         {15, 4096, "b"},
                        {17, 4096, "b"},   {1023, 4096, "c"},      {4096, 4096, "c"},
                        {4097, 8192, "c"}, {65536 + 7, 69632, "d"}};
  std::vector<void*> ptrs;
  uint64_t total = 0;
  std::map<std::string, uint64_t> by_owner;
  for (const Case& c : cases) {
    auto p = pool->Allocate(c.bytes, c.owner);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 4096, 0u) << c.bytes;
    EXPECT_TRUE(pool->Contains(*p, c.charged));
    std::memset(*p, 0xab, c.charged);  // all of it is usable
    ptrs.push_back(*p);
    total += c.charged;
    by_owner[c.owner] += c.charged;
  }
  auto st = pool->Stats();
  EXPECT_EQ(st.budget_bytes, 256 * kKiB);
  EXPECT_EQ(st.in_use_bytes, total);
  EXPECT_EQ(st.peak_bytes, total);
  EXPECT_EQ(st.allocations, std::size(cases));
  ASSERT_EQ(st.owners.size(), by_owner.size());
  EXPECT_EQ(st.owners[0].first, "d");  // largest first
  for (const auto& [owner, bytes] : st.owners) EXPECT_EQ(bytes, by_owner[owner]) << owner;
  // Distinct, non-overlapping.
  std::vector<std::pair<uintptr_t, uint64_t>> ranges;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    ranges.emplace_back(reinterpret_cast<uintptr_t>(ptrs[i]), cases[i].charged);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first);
  }
  for (size_t i = 0; i < ptrs.size(); i += 2) ASSERT_TRUE(pool->Free(ptrs[i]).ok());
  for (size_t i = 1; i < ptrs.size(); i += 2) ASSERT_TRUE(pool->Free(ptrs[i]).ok());
  st = pool->Stats();
  EXPECT_EQ(st.in_use_bytes, 0u);
  EXPECT_EQ(st.peak_bytes, total);
  EXPECT_EQ(st.largest_free_bytes, 256 * kKiB);  // coalesced back into one range
  EXPECT_TRUE(st.owners.empty());
  pool->ResetPeak();
  EXPECT_EQ(pool->Stats().peak_bytes, 0u);
}

TEST(PinnedPoolTest, BadFreesAreRefused) {
  auto pool = MustCreate(64 * kKiB);
  ASSERT_TRUE(pool);
  auto p = pool->Allocate(8192, "x");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(pool->Free(static_cast<char*>(*p) + 4096).code(), StatusCode::kInvalidArgument);
  int outside = 0;
  EXPECT_EQ(pool->Free(&outside).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Free(nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(pool->Free(*p).ok());
  Status twice = pool->Free(*p);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("double free"), std::string::npos);
  EXPECT_EQ(pool->Stats().in_use_bytes, 0u);
  PinnedPoolOptions zero;
  auto r = PinnedPool::Create(zero);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedPoolTest, OutOfMemorySaysRequestUseAndOwners) {
  auto pool = MustCreate(64 * kKiB);
  ASSERT_TRUE(pool);
  auto params = pool->AllocateBuffer(32 * kKiB, "params");
  auto grads = pool->AllocateBuffer(16 * kKiB, "grads");
  auto small = pool->AllocateBuffer(4 * kKiB, "scratch");
  ASSERT_TRUE(params.ok() && grads.ok() && small.ok());
  auto r = pool->Allocate(16 * kKiB, "prefetch");
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(m.find("cannot allocate 16.0 KiB (16384 bytes) for 'prefetch'"), std::string::npos)
      << m;
  EXPECT_NE(m.find("in use 52.0 KiB (53248 bytes) of a budget of 64.0 KiB (65536 bytes)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("top owners: params 32.0 KiB (32768 bytes), grads 16.0 KiB (16384 "
                   "bytes), scratch 4.0 KiB (4096 bytes)"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("fragmented"), std::string::npos) << m;
  // Free the middle: 16 KiB + 12 KiB free, but not contiguous.
  grads->Reset();
  EXPECT_EQ(pool->Stats().in_use_bytes, 36 * kKiB);
  r = pool->Allocate(20 * kKiB, "prefetch");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fragmented"), std::string::npos);
  EXPECT_NE(r.status().message().find("largest free range 16.0 KiB"), std::string::npos)
      << r.status().message();
  // The budget is never exceeded by a successful allocation either.
  auto fits = pool->AllocateBuffer(16 * kKiB, "prefetch");
  ASSERT_TRUE(fits.ok());
  EXPECT_LE(pool->Stats().in_use_bytes, pool->Stats().budget_bytes);
  PinnedBuffer moved = std::move(*fits);
  EXPECT_FALSE(*fits);
  EXPECT_TRUE(moved);
  moved.Reset();
  EXPECT_EQ(pool->Stats().in_use_bytes, 36 * kKiB);
}

// Two threads allocate and free at random; each fills its buffers with its own pattern and
// checks it on free, so an overlap between live allocations would show.
TEST(PinnedPoolTest, RandomAllocFreeFromTwoThreadsStaysInBudget) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed));
  auto pool = MustCreate(1 * kMiB);  // small enough to lock under an 8 MiB RLIMIT_MEMLOCK
  ASSERT_TRUE(pool);
  std::atomic<bool> over_budget{false}, overlap{false}, outside{false};
  std::atomic<int> ooms{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(seed + id);
    struct Live {
      unsigned char* p;
      uint64_t n;
      unsigned char tag;
    };
    std::vector<Live> live;
    for (int i = 0; i < 4000; ++i) {
      if (live.empty() || rng() % 100 < 55) {
        uint64_t n = rng() % 3 == 0 ? rng() % 200 : rng() % (96 * kKiB);
        auto p = pool->Allocate(n, id ? "thread1" : "thread0");
        if (!p.ok()) {
          ++ooms;
          if (p.status().code() != StatusCode::kOutOfMemory) over_budget = true;
          continue;
        }
        auto* c = static_cast<unsigned char*>(*p);
        if (!pool->Contains(c, std::max<uint64_t>(n, 1))) outside = true;
        unsigned char tag = static_cast<unsigned char>(rng() | 1);
        std::memset(c, tag, n);
        live.push_back({c, n, tag});
      } else {
        size_t k = rng() % live.size();
        for (uint64_t j = 0; j < live[k].n; ++j) {
          if (live[k].p[j] != live[k].tag) {
            overlap = true;
            break;
          }
        }
        if (!pool->Free(live[k].p).ok()) overlap = true;
        live[k] = live.back();
        live.pop_back();
      }
      if (pool->Stats().in_use_bytes > pool->size()) over_budget = true;
    }
    for (auto& l : live) {
      if (!pool->Free(l.p).ok()) overlap = true;
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  EXPECT_FALSE(over_budget);
  EXPECT_FALSE(overlap);
  EXPECT_FALSE(outside);
  EXPECT_GT(ooms.load(), 0);  // the budget was actually reached
  auto st = pool->Stats();
  EXPECT_EQ(st.in_use_bytes, 0u);
  EXPECT_LE(st.peak_bytes, st.budget_bytes);
  EXPECT_GT(st.peak_bytes, st.budget_bytes / 2);
  EXPECT_EQ(st.largest_free_bytes, st.budget_bytes);
}

// Runs `fn` in a child process without CAP_IPC_LOCK (so RLIMIT_MEMLOCK applies, as for a
// normal user) and with RLIMIT_MEMLOCK at 8 MiB; returns what it printed, and its exit code.
std::pair<int, std::string> RunUnprivileged(const std::function<int(std::string*)>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    struct rlimit rl {
      8 * kMiB, 8 * kMiB
    };
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) ::_exit(90);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(91);
    std::string out;
    int rc = fn(&out);
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(rc);
  }
  ::close(fds[1]);
  std::string out;
  char buf[1024];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(PinnedPoolTest, MemlockLimitGivesAdviceThenUnlockedMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "AddressSanitizer and ThreadSanitizer turn mlock into a no-op that succeeds";
#endif
  auto [rc, out] = RunUnprivileged([](std::string* out) {
    std::vector<std::string> warnings;
    SetLogSink([&](LogLevel level, std::string_view m) {
      if (level == LogLevel::kWarning) warnings.emplace_back(m);
    });
    // Within the limit: locked, no warning.
    PinnedPoolOptions small;
    small.budget_bytes = 1 * kMiB;
    auto a = PinnedPool::Create(small);
    if (!a.ok() || !(*a)->locked() || !warnings.empty()) {
      *out = "small pool: " + a.status().ToString();
      return 1;
    }
    // Beyond it: one warning with the advice, then unlocked but usable memory.
    PinnedPoolOptions big;
    big.budget_bytes = 64 * kMiB;
    auto b = PinnedPool::Create(big);
    if (!b.ok() || (*b)->locked() || warnings.size() != 1) {
      *out = "big pool: " + b.status().ToString();
      return 2;
    }
    auto p = (*b)->Allocate(48 * kMiB, "params");
    if (!p.ok()) return 3;
    std::memset(*p, 1, 48 * kMiB);
    if ((*b)->Stats().locked) return 4;
    // require_locked: the same advice as an error.
    big.require_locked = true;
    auto c = PinnedPool::Create(big);
    if (c.ok() || c.status().code() != StatusCode::kOutOfMemory) return 5;
    *out = warnings[0] + "\n" + c.status().message();
    SetLogSink(nullptr);
    return 0;
  });
  ASSERT_EQ(rc, 0) << out;
  for (const char* want :
       {"cannot lock 64.0 MiB (67108864 bytes) of pinned memory", "RLIMIT_MEMLOCK is 8.0 MiB",
        "ulimit -l", "/etc/security/limits.conf", "LimitMEMLOCK=", "continuing with unlocked"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " not in:\n" << out;
  }
}

// The arena registers with a real io_uring backend, and a SwapStore moves extents through
// pool buffers on the registered fast path.
TEST(PinnedPoolTest, RegistersWithIoUringAndCarriesSwapIo) {
  auto pool = MustCreate(4 * kMiB);
  ASSERT_TRUE(pool);
  IoBackendOptions bo;
  bo.kind = IoBackendKind::kUring;
  auto backend = CreateIoBackend(bo);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE(pool->RegisterWith(**backend).ok());

  TempDir dir;
  SwapStoreOptions so;
  so.paths = {dir.path()};
  so.capacity_bytes = 8 * kMiB;
  so.backend = bo;
  auto store = SwapStore::Open(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  BufferRegion region{pool->base(), pool->size()};
  ASSERT_TRUE((*store)->RegisterBuffers(std::span<const BufferRegion>(&region, 1)).ok());
  auto src = pool->AllocateBuffer(kMiB + 7, "src");
  auto dst = pool->AllocateBuffer(kMiB + 7, "dst");
  ASSERT_TRUE(src.ok() && dst.ok());
  testing::FillPattern(src->data(), kMiB + 7, 3);
  ASSERT_TRUE((*store)->Write("w", src->data(), kMiB + 7).ok());
  auto n = (*store)->Read("w", dst->data(), dst->size());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, kMiB + 7);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), kMiB + 7), 0);
}

}  // namespace
}  // namespace strata
