// The residency state machine (engine/residency.h): every transition, legal and illegal,
// and the user counting of Enter/Leave; a refusal is an Aborted status and changes nothing.
#include "engine/residency.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

namespace strata::engine_internal {
namespace {

using S = ResidencyState;
constexpr S kAll[] = {S::kAbsent, S::kLoading, S::kReady, S::kInUse, S::kDirty, S::kWriting};

// The machine drawn in residency.h, edge by edge.
const std::set<std::pair<S, S>> kEdges = {
    {S::kAbsent, S::kLoading},  // load submitted
    {S::kAbsent, S::kReady},    // allocated for a use that writes every byte
    {S::kLoading, S::kReady},   // load done
    {S::kReady, S::kInUse},     // first user starts
    {S::kReady, S::kAbsent},    // evicted (no user, not dirty)
    {S::kInUse, S::kInUse},     // another user starts
    {S::kInUse, S::kReady},     // last user done, content unchanged
    {S::kInUse, S::kDirty},     // last user done, content changed
    {S::kDirty, S::kWriting},   // write submitted
    {S::kDirty, S::kInUse},     // used again before its write
    {S::kWriting, S::kReady},   // write done
    {S::kWriting, S::kInUse},   // write done while readers share the copy (WriteDone)
};

TEST(ResidencyTest, EveryTransitionIsAllowedExactlyWhenTheMachineHasIt) {
  for (S from : kAll) {
    for (S to : kAll) {
      const bool want = kEdges.count({from, to}) > 0;
      SCOPED_TRACE(std::string(ResidencyStateName(from)) + " -> " + ResidencyStateName(to));
      EXPECT_EQ(Residency::Allowed(from, to), want);
      Residency r;
      r.state = from;
      const Status st = r.To(to);
      EXPECT_EQ(st.ok(), want);
      // A refusal is an internal error naming both states.
      if (!want) {
        EXPECT_EQ(st.code(), StatusCode::kAborted);
        EXPECT_NE(st.message().find(std::string(ResidencyStateName(from)) + " -> " +
                                    ResidencyStateName(to)),
                  std::string::npos)
            << st.ToString();
      }
      // A refused transition changes nothing.
      EXPECT_EQ(r.state, want ? to : from);
    }
  }
}

TEST(ResidencyTest, StateNamesAreDistinct) {
  std::set<std::string> names;
  for (S s : kAll) names.insert(ResidencyStateName(s));
  EXPECT_EQ(names.size(), std::size(kAll));
  EXPECT_STREQ(ResidencyStateName(S::kInUse), "in_use");
}

TEST(ResidencyTest, ALoadedCopyIsUsedAndEvicted) {
  Residency r;
  EXPECT_EQ(r.state, S::kAbsent);
  ASSERT_TRUE(r.To(S::kLoading).ok());
  EXPECT_FALSE(r.Enter().ok()) << "a copy still loading cannot be used";
  EXPECT_EQ(r.users, 0);
  ASSERT_TRUE(r.To(S::kReady).ok());
  ASSERT_TRUE(r.Enter().ok());
  ASSERT_TRUE(r.Enter().ok());
  EXPECT_EQ(r.users, 2);
  EXPECT_FALSE(r.To(S::kAbsent).ok()) << "a copy in use cannot be evicted";
  ASSERT_TRUE(r.Leave(/*modified=*/false, /*needs_write=*/true).ok());
  EXPECT_EQ(r.state, S::kInUse);
  ASSERT_TRUE(r.Leave(false, true).ok());
  EXPECT_EQ(r.state, S::kReady);
  EXPECT_EQ(r.users, 0);
  ASSERT_TRUE(r.To(S::kAbsent).ok());
}

TEST(ResidencyTest, AModifiedCopyIsDirtyUntilItsWriteCompletes) {
  Residency r;
  ASSERT_TRUE(r.To(S::kReady).ok());  // allocated for a writing use
  ASSERT_TRUE(r.Enter().ok());
  ASSERT_TRUE(r.Enter().ok());
  // One user modifies, the other does not: the copy is dirty once the last one leaves.
  ASSERT_TRUE(r.Leave(/*modified=*/true, /*needs_write=*/true).ok());
  EXPECT_EQ(r.state, S::kInUse);
  ASSERT_TRUE(r.Leave(false, true).ok());
  EXPECT_EQ(r.state, S::kDirty);
  EXPECT_FALSE(r.To(S::kAbsent).ok()) << "a dirty copy cannot be dropped";
  EXPECT_FALSE(r.To(S::kReady).ok()) << "a dirty copy must be written first";
  // Used again before its write was submitted (a reader): still dirty afterwards, or the
  // write would find it kReady and an eviction could drop it unwritten.
  ASSERT_TRUE(r.Enter().ok());
  ASSERT_TRUE(r.Leave(/*modified=*/false, /*needs_write=*/true).ok());
  EXPECT_EQ(r.state, S::kDirty) << "a reader of a dirty copy cleared its dirty mark";
  ASSERT_TRUE(r.To(S::kWriting).ok());
  EXPECT_FALSE(r.To(S::kAbsent).ok());
  ASSERT_TRUE(r.WriteDone().ok());
  EXPECT_EQ(r.state, S::kReady);
  ASSERT_TRUE(r.To(S::kAbsent).ok());
}

// The write only reads the copy: readers (the next forward's H2D copy of a block whose
// update is being written) share it. It stays kWriting, so it is neither evicted nor given
// to a user that modifies it, until the write is done and the readers left.
TEST(ResidencyTest, ReadersShareACopyBeingWritten) {
  Residency r;
  r.state = S::kWriting;
  ASSERT_TRUE(r.Enter().ok());
  ASSERT_TRUE(r.Enter().ok());
  EXPECT_EQ(r.state, S::kWriting);
  EXPECT_EQ(r.users, 2);
  EXPECT_FALSE(r.To(S::kAbsent).ok()) << "a copy being written was evicted";
  ASSERT_TRUE(r.Leave(/*modified=*/false, /*needs_write=*/true).ok());
  EXPECT_EQ(r.state, S::kWriting) << "a reader ended the write";
  // The write completes under the other reader: in use, then ready when it leaves.
  ASSERT_TRUE(r.WriteDone().ok());
  EXPECT_EQ(r.state, S::kInUse);
  EXPECT_FALSE(r.To(S::kAbsent).ok());
  ASSERT_TRUE(r.Leave(false, true).ok());
  EXPECT_EQ(r.state, S::kReady);
  EXPECT_EQ(r.users, 0);
  EXPECT_FALSE(r.WriteDone().ok()) << "a write completed twice";
  EXPECT_EQ(r.state, S::kReady);
}

TEST(ResidencyTest, AUserThatModifiesACopyBeingWrittenIsRefused) {
  Residency r;
  r.state = S::kWriting;
  ASSERT_TRUE(r.Enter().ok());
  const Status s = r.Leave(/*modified=*/true, /*needs_write=*/true);
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_EQ(r.state, S::kWriting);
}

TEST(ResidencyTest, AModifiedCopyWithoutAnNvmeHomeStaysReady) {
  Residency r;
  r.state = S::kReady;
  ASSERT_TRUE(r.Enter().ok());
  ASSERT_TRUE(r.Leave(/*modified=*/true, /*needs_write=*/false).ok());
  EXPECT_EQ(r.state, S::kReady);
}

TEST(ResidencyTest, LeaveWithoutAUserIsRefused) {
  for (S s : kAll) {
    Residency r;
    r.state = s;
    EXPECT_FALSE(r.Leave(false, false).ok()) << ResidencyStateName(s);
    EXPECT_EQ(r.state, s);
    EXPECT_EQ(r.users, 0);
  }
}

TEST(ResidencyTest, EnterIsRefusedWhereTheMachineHasNoUse) {
  for (S s : kAll) {
    Residency r;
    r.state = s;
    const bool want = s == S::kReady || s == S::kDirty || s == S::kInUse || s == S::kWriting;
    EXPECT_EQ(r.Enter().ok(), want) << ResidencyStateName(s);
    EXPECT_EQ(r.users, want ? 1 : 0);
    // A reader of a copy being written leaves it kWriting (the write still owns it).
    EXPECT_EQ(r.state, want && s != S::kWriting ? S::kInUse : s);
  }
}

}  // namespace
}  // namespace strata::engine_internal
