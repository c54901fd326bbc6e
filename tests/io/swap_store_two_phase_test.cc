// SwapStore's two-phase commit (PrepareCommit / FinishCommit) and the decision at Open
// about a prepared commit cut short (SwapStoreOptions::resolve_prepared): what the ranks of
// one run rely on to never be left without a step they all hold.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "io/swap_store.h"
#include "io_test_util.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::FillPattern;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  FillPattern(s.data(), n, seed);
  return s;
}

Status WriteString(SwapStore& store, const std::string& key, const std::string& data) {
  AlignedBuffer buf(data.size());
  std::memcpy(buf.data(), data.data(), data.size());
  return store.Write(key, buf.data(), data.size());
}

Result<std::string> ReadAll(SwapStore& store, const std::string& key) {
  auto info = store.Lookup(key);
  if (!info) return Status::NotFound(key);
  AlignedBuffer buf(info->length);
  STRATA_ASSIGN_OR_RETURN(uint64_t n, store.Read(key, buf.data(), info->length));
  return std::string(buf.data(), n);
}

struct Seen {
  int calls = 0;
  std::optional<uint64_t> committed, prepared;
};

SwapStoreOptions Options(const std::string& dir, Seen* seen, bool roll_forward) {
  SwapStoreOptions o;
  o.paths = {dir};
  o.capacity_bytes = 4 * kMiB;
  o.resolve_prepared = [seen, roll_forward](std::optional<uint64_t> committed,
                                            std::optional<uint64_t> prepared) -> Result<bool> {
    ++seen->calls;
    seen->committed = committed;
    seen->prepared = prepared;
    return roll_forward && prepared.has_value();
  };
  return o;
}

// Step 1 committed, step 2 prepared and then the process "dies" (the store goes away
// without FinishCommit): a reopen is offered step 2 and takes it, or leaves it.
void PrepareTwoAndStop(const std::string& dir) {
  Seen seen;
  SwapStoreOptions o = Options(dir, &seen, false);
  auto store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE(WriteString(**store, "a", Pattern(5000, 1)).ok());
  ASSERT_TRUE(WriteString(**store, "b", Pattern(100, 2)).ok());
  ASSERT_TRUE((*store)->Commit(1).ok());
  ASSERT_TRUE(WriteString(**store, "a", Pattern(5000, 3)).ok());
  ASSERT_TRUE((*store)->PrepareCommit(2).ok());
  EXPECT_EQ((*store)->CommittedStep(), std::optional<uint64_t>(1));
}

TEST(SwapStoreTwoPhaseTest, APreparedCommitIsRolledForwardWhenAsked) {
  TempDir dir;
  PrepareTwoAndStop(dir.path());
  Seen seen;
  auto store = SwapStore::Open(Options(dir.path(), &seen, true));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.committed, std::optional<uint64_t>(1));
  EXPECT_EQ(seen.prepared, std::optional<uint64_t>(2));
  EXPECT_EQ((*store)->CommittedStep(), std::optional<uint64_t>(2));
  EXPECT_EQ(*ReadAll(**store, "a"), Pattern(5000, 3));
  EXPECT_EQ(*ReadAll(**store, "b"), Pattern(100, 2));
  store->reset();
  // Rolled forward for good: the next open sees step 2 committed and nothing prepared.
  Seen again;
  auto reopened = SwapStore::Open(Options(dir.path(), &again, false));
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ(again.prepared, std::nullopt);
  EXPECT_EQ((*reopened)->CommittedStep(), std::optional<uint64_t>(2));
  EXPECT_EQ(*ReadAll(**reopened, "a"), Pattern(5000, 3));
}

TEST(SwapStoreTwoPhaseTest, APreparedCommitIsDiscardedOtherwise) {
  TempDir dir;
  PrepareTwoAndStop(dir.path());
  Seen seen;
  auto store = SwapStore::Open(Options(dir.path(), &seen, false));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(seen.prepared, std::optional<uint64_t>(2));
  EXPECT_EQ((*store)->CommittedStep(), std::optional<uint64_t>(1));
  EXPECT_EQ(*ReadAll(**store, "a"), Pattern(5000, 1));
  // The discarded manifest is gone and its space is free: the store keeps committing.
  for (uint64_t step = 2; step < 8; ++step) {
    ASSERT_TRUE(WriteString(**store, "a", Pattern(5000, 10 + step)).ok());
    ASSERT_TRUE((*store)->Commit(step).ok());
  }
  store->reset();
  Seen again;
  auto reopened = SwapStore::Open(Options(dir.path(), &again, true));
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(again.prepared, std::nullopt);
  EXPECT_EQ(*ReadAll(**reopened, "a"), Pattern(5000, 17));
}

// A decision that fails fails the Open (a rank that cannot agree with its peers).
TEST(SwapStoreTwoPhaseTest, AFailedDecisionFailsTheOpen) {
  TempDir dir;
  PrepareTwoAndStop(dir.path());
  SwapStoreOptions o;
  o.paths = {dir.path()};
  o.resolve_prepared = [](std::optional<uint64_t>, std::optional<uint64_t>) -> Result<bool> {
    return Status::Aborted("rank 1 could not open its store");
  };
  auto store = SwapStore::Open(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kAborted);
}

// Between the phases nothing may be written: FinishCommit refuses, and the commit can be
// prepared again.
TEST(SwapStoreTwoPhaseTest, AWriteBetweenThePhasesIsRefused) {
  TempDir dir;
  Seen seen;
  auto store = SwapStore::Open(Options(dir.path(), &seen, false));
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(WriteString(**store, "a", Pattern(100, 1)).ok());
  ASSERT_TRUE((*store)->PrepareCommit(1).ok());
  EXPECT_EQ((*store)->PrepareCommit(1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteString(**store, "a", Pattern(100, 2)).ok());
  EXPECT_EQ((*store)->FinishCommit().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->FinishCommit().code(), StatusCode::kInvalidArgument);  // nothing prepared
}

// Without a resolver (one rank), a prepared manifest left by a crash is discarded.
TEST(SwapStoreTwoPhaseTest, WithoutAResolverAPreparedCommitIsDiscarded) {
  TempDir dir;
  PrepareTwoAndStop(dir.path());
  SwapStoreOptions o;
  o.paths = {dir.path()};
  auto store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->CommittedStep(), std::optional<uint64_t>(1));
  EXPECT_EQ(*ReadAll(**store, "a"), Pattern(5000, 1));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A store of "run rank 0 of 2" reopened as "run rank 0 of 3" (previous_run_id: a resume on
// another rank count): the committed manifest keeps the old identity until the next commit,
// which may record the same step again; that commit, prepared and cut short, is offered to
// the decider as "nothing committed of the new identity" and rolled forward when asked, or
// dropped, leaving the old store.
TEST(SwapStoreTwoPhaseTest, ARestampUnderANewIdentityIsTwoPhase) {
  for (const bool roll_forward : {true, false}) {
    TempDir dir;
    {
      Seen seen;
      SwapStoreOptions o = Options(dir.path(), &seen, false);
      o.run_id = "run rank 0 of 2";
      auto store = SwapStore::Open(o);
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      ASSERT_TRUE(WriteString(**store, "a", Pattern(5000, 1)).ok());
      ASSERT_TRUE((*store)->Commit(3).ok());
    }
    {
      Seen seen;
      SwapStoreOptions o = Options(dir.path(), &seen, false);
      o.create = false;
      o.run_id = "run rank 0 of 3";
      EXPECT_FALSE(SwapStore::Open(o).ok());  // another identity, not named as the previous
      o.previous_run_id = "run rank 0 of 2";
      auto store = SwapStore::Open(o);
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      EXPECT_EQ((*store)->RunId(), "run rank 0 of 2");  // until the next commit
      ASSERT_TRUE(WriteString(**store, "a", Pattern(3000, 2)).ok());
      ASSERT_TRUE((*store)->PrepareCommit(3).ok());  // the same step, restamped
    }
    auto peek = SwapStore::PeekManifests(dir.path());
    ASSERT_TRUE(peek.ok());
    EXPECT_EQ(peek->run_id, "run rank 0 of 2");
    EXPECT_EQ(peek->prepared_run_id, "run rank 0 of 3");
    EXPECT_EQ(peek->prepared_step, std::optional<uint64_t>(3));
    Seen seen;
    SwapStoreOptions o = Options(dir.path(), &seen, roll_forward);
    o.create = false;
    o.run_id = "run rank 0 of 3";
    o.previous_run_id = "run rank 0 of 2";
    auto store = SwapStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(seen.committed, std::nullopt);  // nothing committed of the new identity
    EXPECT_EQ(seen.prepared, std::optional<uint64_t>(3));
    EXPECT_EQ((*store)->CommittedStep(), std::optional<uint64_t>(3));
    EXPECT_EQ((*store)->RunId(), roll_forward ? "run rank 0 of 3" : "run rank 0 of 2");
    EXPECT_EQ(*ReadAll(**store, "a"), roll_forward ? Pattern(3000, 2) : Pattern(5000, 1));
  }
}

}  // namespace
// PeekManifests, what a resume reads of each rank's store before opening it: the committed
// manifest is opened and read once (its step and identity from the same bytes), and one
// that does not decode (truncated, or edited) is Corruption naming the file.
TEST(SwapStorePeekTest, ReadsTheManifestOnceAndNamesADamagedOne) {
  TempDir dir;
  {
    Seen seen;
    SwapStoreOptions o = Options(dir.path(), &seen, false);
    o.run_id = "run rank 0 of 1";
    auto store = SwapStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(WriteString(**store, "a", Pattern(3000, 1)).ok());
    ASSERT_TRUE((*store)->Commit(4).ok());
  }
  const std::string manifest = dir.path() + "/strata.manifest";
  const int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(in, 0);
  // Closes watched too: identical events in a row are coalesced into one.
  ASSERT_GE(inotify_add_watch(in, manifest.c_str(), IN_OPEN | IN_CLOSE_NOWRITE), 0);
  auto peek = SwapStore::PeekManifests(dir.path());
  ASSERT_TRUE(peek.ok()) << peek.status().ToString();
  EXPECT_EQ(peek->step, std::optional<uint64_t>(4));
  EXPECT_EQ(peek->run_id, "run rank 0 of 1");
  int opens = 0;
  alignas(inotify_event) char events[4096];
  for (ssize_t n; (n = read(in, events, sizeof events)) > 0;) {
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(events + at);
      opens += (e->mask & IN_OPEN) != 0;
      at += ssize_t(sizeof(inotify_event) + e->len);
    }
  }
  close(in);
  EXPECT_EQ(opens, 1) << manifest << " was opened " << opens << " times";

  std::string bytes;
  {
    std::ifstream f(manifest, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 16u);
  std::string edited = bytes;
  edited[edited.size() / 2] ^= 0x20;
  for (const std::string& damaged : {bytes.substr(0, bytes.size() / 2), edited, std::string()}) {
    std::ofstream(manifest, std::ios::binary | std::ios::trunc) << damaged;
    auto p = SwapStore::PeekManifests(dir.path());
    ASSERT_FALSE(p.ok()) << damaged.size() << " bytes";
    EXPECT_EQ(p.status().code(), StatusCode::kCorruption) << p.status().ToString();
    EXPECT_EQ(p.status().path(), manifest) << p.status().ToString();
    EXPECT_NE(p.status().message().find(manifest), std::string::npos) << p.status().ToString();
  }
}

}  // namespace strata
