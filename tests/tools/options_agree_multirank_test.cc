// `strata train` across ranks started with different options: every rank stops at start-up
// with one message that lists each differing option with its values and ranks, the
// trainer's own options (data, batch, schedule) as well as the engine's, instead of a
// deadlock or a silently different run. Runs the built strata binary (STRATA_CLI_PATH).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::Contains;

CliRun Launch(const std::string& rank_command) {
  testing::CliRunOptions o;
  o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  o.timeout_s = 90;
  return testing::RunCli("launch -n 3 --grace 5 -- sh -c '" + rank_command + "'", o);
}

const std::string kTrain = std::string("exec ") + STRATA_CLI_PATH +
                           " train --layers 2 --d-model 32 --heads 2 --seq-len 16 --steps 3 "
                           "--comm-timeout 30";

TEST(RankOptions, TrainerOptionsThatDifferAreListedPerRank) {
  testing::TempDir dir("strata-agree");
  // Same size, other bytes: the data is compared by its tokens, not its name or size.
  std::ofstream(dir.File("a.txt")) << std::string(4000, 'a');
  std::ofstream(dir.File("b.txt")) << std::string(4000, 'b');
  const CliRun r = Launch(kTrain + " --data " + dir.path() +
                          "/$([ $RANK = 2 ] && echo b || echo a).txt --batch 6 --lr "
                          "$([ $RANK = 1 ] && echo 0.002 || echo 0.001) --lr-schedule cosine");
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] strata train: rank " +
                               std::to_string(rank) +
                               " of 3: comparing the ranks' options: "
                               "InvalidArgument: the ranks' options differ: --lr: 0.001 on ranks "
                               "0, 2 vs 0.002 on rank 1; --data (its tokens): 4000 tokens, xxh3 ";
    EXPECT_TRUE(Contains(r.output, prefix)) << r.output;
  }
  EXPECT_TRUE(Contains(r.output, " on ranks 0, 1 vs 4000 tokens, xxh3 ")) << r.output;
}

TEST(RankOptions, EngineOptionsThatDifferAreListedPerRank) {
  const CliRun r =
      Launch(kTrain + " --batch 6 --host-mem $([ $RANK = 0 ] && echo 64M || echo 32M)");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output,
                       "the ranks' engine options differ: host_mem_bytes (--host-mem): "
                       "67108864 on rank 0 vs 33554432 on ranks 1, 2"))
      << r.output;
}

}  // namespace
}  // namespace strata
