// SwapStore's two-phase commit (PrepareCommit / FinishCommit) and the decision at Open
// about a prepared commit cut short (SwapStoreOptions::resolve_prepared): what the ranks of
// one run rely on to never be left without a step they all hold.
#include <gtest/gtest.h>

#include <cstring>
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
