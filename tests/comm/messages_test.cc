// comm/messages.h over real Gloo ranks (forked processes on loopback): a root's outcome
// reaches every rank, typed all-gathers arrive in rank order, and the resumed-step agreement
// names the rank that differs.
#include "comm/messages.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tests/comm/forked_ranks.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

struct Shape {
  int32_t layers, d_model;
  double lr;
};

// The exit codes of `world` ranks running `body` (tests/comm/forked_ranks.h; 0 = its checks
// passed).
std::vector<int> RunRanks(int world, const std::function<int(Communicator&)>& body) {
  std::vector<int> codes;
  for (const ChildResult& r : strata::RunRanks(world, 30s, body)) codes.push_back(r.exit_code);
  return codes;
}

TEST(CommMessages, ShareFromRootDeliversTheValueOrTheFailure) {
  auto codes = RunRanks(3, [](Communicator& comm) {
    const bool root = comm.rank() == 1;
    // The root's value reaches everyone; the others' arguments are ignored.
    std::optional<Shape> mine =
        root ? std::optional<Shape>(Shape{6, 384, 0.5}) : std::optional<Shape>(Shape{-1, -1, -1});
    auto got = ShareFromRoot(comm, 1, mine, "test: share shape");
    CHILD_CHECK(got.ok());
    CHILD_CHECK(got->has_value());
    CHILD_CHECK((*got)->layers == 6 && (*got)->d_model == 384 && (*got)->lr == 0.5);
    // A root that failed: every rank learns it, even those that passed a value.
    auto failed = ShareFromRoot(comm, 1, root ? std::nullopt : mine, "test: share failure");
    CHILD_CHECK(failed.ok());
    CHILD_CHECK(!failed->has_value());
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST(CommMessages, AllGatherMessagesArriveInRankOrder) {
  auto codes = RunRanks(3, [](Communicator& comm) {
    Shape mine{comm.rank(), 100 + comm.rank(), comm.rank() * 0.25};
    auto all = AllGatherMessages(comm, mine, "test: gather shapes");
    CHILD_CHECK(all.ok());
    CHILD_CHECK(all->size() == 3);
    for (int r = 0; r < 3; ++r) {
      CHILD_CHECK((*all)[r].layers == r && (*all)[r].d_model == 100 + r);
      CHILD_CHECK((*all)[r].lr == r * 0.25);
    }
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST(CommMessages, ResumedStepAgreementNamesTheRankThatDiffers) {
  auto codes = RunRanks(3, [](Communicator& comm) {
    CHILD_CHECK(AgreeOnResumedStep(comm, 7).ok());
    // Rank 2 resumes another step: every rank fails, naming the first that differs from it.
    const int64_t step = comm.rank() == 2 ? 5 : 7;
    Status s = AgreeOnResumedStep(comm, step);
    CHILD_CHECK(s.code() == StatusCode::kInvalidArgument);
    const std::string expected = comm.rank() == 2 ? "rank 0 resumes step 7 but this rank step 5"
                                                  : "rank 2 resumes step 5 but this rank step 7";
    CHILD_CHECK(s.message().find(expected) != std::string::npos);
    CHILD_CHECK(s.message().find("same world size") != std::string::npos);
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST(CommMessages, OptionCheckListsEveryDifferenceWithItsRanks) {
  auto codes = RunRanks(3, [](Communicator& comm) {
    const int r = comm.rank();
    const std::string long_tail(80, 'x');
    std::vector<NamedValue> same = {{"--batch", "8"}, {"--lr", "0.003"}};
    CHILD_CHECK(CheckSameOnEveryRank(comm, same, "options").ok());
    // --batch differs on rank 1, --lr on rank 2; --data differs only past the characters
    // shown, and is still caught (compared whole).
    std::vector<NamedValue> mine = {{"--batch", r == 1 ? "4" : "8"},
                                    {"--lr", r == 2 ? "0.001" : "0.003"},
                                    {"--seed", "1"},
                                    {"--data", long_tail + (r == 0 ? "a" : "b")}};
    Status s = CheckSameOnEveryRank(comm, mine, "options");
    CHILD_CHECK(s.code() == StatusCode::kInvalidArgument);
    const std::string shown = std::string(52, 'x') + "...";
    const std::string expected =
        "the ranks' options differ: --batch: 8 on ranks 0, 2 vs 4 on "
        "rank 1; --lr: 0.003 on ranks 0, 1 vs 0.001 on rank 2; --data: " +
        shown + " on rank 0 vs " + shown + " on ranks 1, 2; start every";
    if (s.message().find(expected) == std::string::npos) {
      std::fprintf(stderr, "rank %d: %s\n", r, s.message().c_str());
      return 1;
    }
    // A rank with another option list (another build) is named.
    std::vector<NamedValue> fewer(same.begin(), same.begin() + (r == 0 ? 1 : 2));
    Status c = CheckSameOnEveryRank(comm, fewer, "options");
    CHILD_CHECK(c.code() == StatusCode::kInvalidArgument);
    CHILD_CHECK(c.message().find("same build") != std::string::npos);
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace strata
