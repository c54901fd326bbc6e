// comm/rank_groups.h: one thing's value across ranks, grouped and worded as the multi-rank
// checks report it.
#include "comm/rank_groups.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata {
namespace {

TEST(RankGroups, RankListSeparatesWithCommas) {
  EXPECT_EQ(RankList({}), "");
  EXPECT_EQ(RankList({3}), "3");
  EXPECT_EQ(RankList({0, 2, 5}), "0, 2, 5");
}

TEST(RankGroups, SameValueOnEveryRankIsNoDifference) {
  EXPECT_EQ(DescribeRankDifference(
                "--batch", 4, [](int) { return 8; }, [](int) { return std::string("8"); }),
            "");
  EXPECT_EQ(DescribeRankDifference(
                "--batch", 1, [](int) { return 8; }, [](int) { return std::string("8"); }),
            "");
}

TEST(RankGroups, ValuesInOrderOfTheirFirstRank) {
  const std::vector<int> batch = {8, 4, 8, 2, 4};
  EXPECT_EQ(DescribeRankDifference(
                "--batch", 5, [&](int r) { return batch[r]; },
                [&](int r) { return std::to_string(batch[r]); }),
            "--batch: 8 on ranks 0, 2 vs 4 on ranks 1, 4 vs 2 on rank 3");
}

TEST(RankGroups, ComparesTheKeyAndShowsTheFirstRanksText) {
  // Keys equal (a hash), texts cut differently: the group shows its first rank's text.
  const std::vector<std::string> text = {"abc...", "abd", "abc..x"};
  const std::vector<int> key = {1, 2, 1};
  EXPECT_EQ(DescribeRankDifference(
                "model", 3, [&](int r) { return key[r]; }, [&](int r) { return text[r]; }),
            "model: abc... on ranks 0, 2 vs abd on rank 1");
}

}  // namespace
}  // namespace strata
