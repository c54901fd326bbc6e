// SwapStore crash consistency: a child process writes new versions and commits in a loop and
// is SIGKILLed — at each named point of the write/commit path (data queued, before the
// data sync, after it, with the temporary manifest written, right after the rename, after
// the commit) and at random times. After each kill the store is re-opened and must hold
// exactly the versions of the last committed step, byte for byte; the child reports each
// step it committed through a pipe, and the contents of every step follow from a seeded
// plan, so the parent knows what each step must contain.
//
// The child is this binary re-executed (fork + exec, so no thread of the parent, such as
// the posix backend's TBB pool, is cloned half-way): `--swap-crash-child DIR SEED POINT
// STEP FD BACKEND`.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/swap_store.h"
#include "io_test_util.h"

namespace strata {
namespace {

using testing::FillPattern;
using testing::TempDir;

constexpr int kKeys = 8;
constexpr uint64_t kCapacity = 32 << 20;  // room for committed + decoy + new versions
const uint64_t kOddSizes[] = {0, 1, 15, 17, 1023, 4096, (1 << 20) + 7};

struct Version {
  uint64_t size;
  uint64_t pattern;
};
using State = std::map<std::string, Version>;

struct Action {
  std::string key;
  bool remove;  // delete when present, else write
  Version v;
};

// What step `step` does, given the state before it. Deterministic in (seed, step).
std::vector<Action> Plan(uint64_t seed, uint64_t step) {
  std::mt19937_64 rng(seed * 1000003 + step);
  std::vector<Action> out;
  for (int k = 0; k < kKeys; ++k) {
    int r = static_cast<int>(rng() % 100);
    uint64_t size = rng() % 3 == 0 ? kOddSizes[rng() % std::size(kOddSizes)] : rng() % 600000;
    uint64_t pattern = rng();
    if (r < 45) {
      out.push_back({"c" + std::to_string(k), false, {size, pattern}});
    } else if (r < 50) {
      out.push_back({"c" + std::to_string(k), true, {}});
    }
  }
  return out;
}

void Apply(const std::vector<Action>& plan, State* state) {
  for (const Action& a : plan) {
    if (a.remove) {
      state->erase(a.key);
    } else {
      (*state)[a.key] = a.v;
    }
  }
}

State ExpectedAt(uint64_t seed, uint64_t step) {
  State s;
  for (uint64_t i = 1; i <= step; ++i) Apply(Plan(seed, i), &s);
  return s;
}

SwapStoreOptions StoreOptions(const std::string& dir, IoBackendKind kind) {
  SwapStoreOptions o;
  o.paths = {dir + "/d0", dir + "/d1"};
  o.capacity_bytes = kCapacity;
  o.stripe_bytes = 128 * 1024;
  o.backend.kind = kind;
  return o;
}

// ---- child ----

uint64_t g_step = 0;

int ChildMain(char** argv) {
  const std::string dir = argv[0];
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const std::string point = argv[2];
  const uint64_t kill_step = std::strtoull(argv[3], nullptr, 10);
  const int fd = std::atoi(argv[4]);
  const IoBackendKind kind =
      std::string(argv[5]) == "uring" ? IoBackendKind::kUring : IoBackendKind::kPosix;
  SwapStoreOptions o = StoreOptions(dir, kind);
  o.test_hook = [&](std::string_view p) {
    if (g_step == kill_step && p == point) ::raise(SIGKILL);
  };
  auto store = SwapStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "child: %s\n", store.status().ToString().c_str());
    return 2;
  }
  uint64_t step = (*store)->CommittedStep().value_or(0);
  // Bounded, so that a kill point the plan never reaches fails the test instead of hanging.
  for (uint64_t s = step + 1; s <= step + 2000; ++s) {
    g_step = s;
    std::vector<Action> plan = Plan(seed, s);
    // Three batches: throw-away versions of the keys to be written (superseded within the
    // step), then the real versions in two halves, so later writes of a step land in space
    // that earlier ones of the same step released.
    std::vector<Action> writes;
    for (const Action& a : plan) {
      if (!a.remove) writes.push_back(a);
    }
    std::vector<std::vector<Action>> batches(3);
    for (size_t i = 0; i < writes.size(); ++i) {
      Action decoy = writes[i];
      decoy.v.size = (decoy.v.size * 3) / 4 + 4096;
      decoy.v.pattern ^= 0xdead;
      batches[0].push_back(decoy);
      batches[i < writes.size() / 2 ? 1 : 2].push_back(writes[i]);
    }
    for (const auto& batch : batches) {
      std::vector<SwapOp> ops;
      std::vector<void*> buffers;
      for (const Action& a : batch) {
        void* p = nullptr;
        if (::posix_memalign(&p, 4096, a.v.size + 4096) != 0) return 3;
        FillPattern(p, a.v.size, a.v.pattern);
        buffers.push_back(p);
        ops.push_back(SwapOp{IoOp::kWrite, a.key, p, a.v.size});
      }
      auto tickets = (*store)->Submit(ops);
      if (!tickets.ok()) return 4;
      std::vector<SwapCompletion> done(ops.size());
      auto n = (*store)->Poll(done, ops.size());
      if (!n.ok() || *n != ops.size()) return 5;
      for (const auto& c : done) {
        if (!c.status.ok()) {
          std::fprintf(stderr, "child: %s\n", c.status.ToString().c_str());
          return 6;
        }
      }
      for (void* p : buffers) std::free(p);
    }
    for (const Action& a : plan) {
      if (a.remove) {
        Status st = (*store)->Delete(a.key);
        if (!st.ok() && st.code() != StatusCode::kNotFound) return 7;
      }
    }
    Status c = (*store)->Commit(s);
    if (!c.ok()) {
      std::fprintf(stderr, "child: %s\n", c.ToString().c_str());
      return 8;
    }
    if (::write(fd, &s, sizeof(s)) != sizeof(s)) return 9;
  }
  return 0;
}

// ---- parent ----

struct ChildResult {
  bool killed = false;    // died of SIGKILL
  uint64_t reported = 0;  // last step the child reported committed (0: none)
  std::string how;
};

// Starts the child, lets it run `run_ms` (0: until it kills itself), kills it.
ChildResult RunChild(const std::string& dir, uint64_t seed, const std::string& point,
                     uint64_t kill_step, IoBackendKind kind, int run_ms) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--swap-crash-child",
                                   dir,
                                   std::to_string(seed),
                                   point,
                                   std::to_string(kill_step),
                                   std::to_string(fds[1]),
                                   kind == IoBackendKind::kUring ? "uring" : "posix"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  if (run_ms > 0) {
    ::usleep(static_cast<useconds_t>(run_ms) * 1000);
    ::kill(pid, SIGKILL);
  }
  ChildResult r;
  uint64_t s;
  while (::read(fds[0], &s, sizeof(s)) == sizeof(s)) r.reported = s;
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  r.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  r.how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                              : "exit " + std::to_string(WEXITSTATUS(status));
  return r;
}

// Re-opens the store and checks it against the plan at its committed step; returns it.
uint64_t VerifyStore(const std::string& dir, uint64_t seed, IoBackendKind kind) {
  auto store = SwapStore::Open(StoreOptions(dir, kind));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return 0;
  const uint64_t step = (*store)->CommittedStep().value_or(0);
  const State want = ExpectedAt(seed, step);
  std::vector<std::string> keys;
  for (const auto& [k, v] : want) keys.push_back(k);
  EXPECT_EQ((*store)->Keys(), keys) << "at step " << step;
  auto st = (*store)->Stats();
  EXPECT_EQ(st.in_use_bytes, st.committed_bytes);  // uncommitted writes are free space again
  void* buf = nullptr;
  EXPECT_EQ(::posix_memalign(&buf, 4096, 1 << 21), 0);
  std::string expect;
  for (const auto& [k, v] : want) {
    auto n = (*store)->Read(k, buf, 1 << 21);
    EXPECT_TRUE(n.ok()) << k << " at step " << step << ": " << n.status().ToString();
    if (!n.ok()) continue;
    expect.assign(v.size, '\0');
    FillPattern(expect.data(), v.size, v.pattern);
    EXPECT_EQ(*n, v.size) << k;
    EXPECT_TRUE(*n == v.size && std::memcmp(buf, expect.data(), v.size) == 0)
        << k << " differs from its version at step " << step;
    auto info = (*store)->Lookup(k);
    EXPECT_TRUE(info && info->committed && info->step <= step);
  }
  std::free(buf);
  return step;
}

class SwapStoreCrashTest : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    ASSERT_EQ(::mkdir((dir_.path() + "/d0").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((dir_.path() + "/d1").c_str(), 0755), 0);
    seed_ = testing::TestSeed();
  }
  TempDir dir_;
  uint64_t seed_ = 0;
};

// Killed at each named point: before the rename the store re-opens at the previous step,
// from the rename on at the step being committed.
TEST_P(SwapStoreCrashTest, KilledAtEachPointOfTheCommitPath) {
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed_));
  std::mt19937_64 rng(seed_);
  struct Point {
    const char* name;
    bool durable;  // the step being committed survives
  };
  const Point points[] = {{"write_submitted", false}, {"commit_begin", false},
                          {"data_synced", false},     {"manifest_temp_written", false},
                          {"manifest_renamed", true}, {"committed", true}};
  uint64_t step = 0;
  for (int round = 0; round < 2; ++round) {
    for (const Point& p : points) {
      uint64_t target = step + 1 + rng() % 3;
      // "write_submitted" needs a step that writes something.
      auto writes = [&](uint64_t t) {
        for (const Action& a : Plan(seed_, t)) {
          if (!a.remove) return true;
        }
        return false;
      };
      while (!writes(target)) ++target;
      ChildResult r = RunChild(dir_.path(), seed_, p.name, target, GetParam(), 0);
      ASSERT_TRUE(r.killed) << p.name << ": child ended with " << r.how;
      // The child commits step+1 .. target-1 before it is killed.
      EXPECT_EQ(r.reported, target - 1 > step ? target - 1 : 0) << p.name;
      const uint64_t got = VerifyStore(dir_.path(), seed_, GetParam());
      EXPECT_EQ(got, p.durable ? target : target - 1) << "killed at " << p.name;
      if (::testing::Test::HasFailure()) return;
      step = got;
    }
  }
}

// Killed at random instants, over and over, each run continuing from the re-opened store.
TEST_P(SwapStoreCrashTest, KilledAtRandomTimes) {
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed_));
  std::mt19937_64 rng(seed_ ^ 0x5eed);
  uint64_t last = 0;
  for (int round = 0; round < 12; ++round) {
    const int ms = 5 + static_cast<int>(rng() % 200);
    ChildResult r = RunChild(dir_.path(), seed_, "none", 0, GetParam(), ms);
    ASSERT_TRUE(r.killed) << "child ended with " << r.how;
    const uint64_t got = VerifyStore(dir_.path(), seed_, GetParam());
    // Reported steps are committed; the one under way may or may not have made it.
    EXPECT_GE(got, std::max(r.reported, last));
    EXPECT_LE(got, std::max(r.reported, last) + 1);
    if (::testing::Test::HasFailure()) return;
    last = got;
  }
  std::printf("reached step %llu over 12 kills\n", static_cast<unsigned long long>(last));
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreCrashTest,
                         ::testing::Values(IoBackendKind::kPosix, IoBackendKind::kUring),
                         [](const auto& info) { return IoBackendKindName(info.param); });

}  // namespace
}  // namespace strata

// The child mode must be chosen before GoogleTest sees the arguments, so this binary has
// its own main (gtest_main's is then not linked in).
int main(int argc, char** argv) {
  if (argc >= 8 && std::string(argv[1]) == "--swap-crash-child") {
    return strata::ChildMain(argv + 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
