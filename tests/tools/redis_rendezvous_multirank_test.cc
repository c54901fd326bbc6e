// The Redis rendezvous on a real redis-server (started by the test on a free loopback port,
// stopped at the end): `strata train` with 2 and 4 ranks meeting through
// --rendezvous redis://HOST:PORT/PREFIX gives the same losses as through a folder; a run
// that ends leaves no key behind, so a rerun with the same prefix works; a stale key of a
// run that did not end cleanly is refused naming it and how to delete it; and a Redis server
// that goes away during start-up is an error naming it, not a wait for the timeout.
// Skipped (saying why) where redis-server is not installed: tools/bootstrap.sh installs it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tests/tools/redis_server.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::Contains;

const std::string kCli = STRATA_CLI_PATH;
const std::string kModel =
    "train --layers 2 --d-model 32 --heads 2 --seq-len 16 --batch 4 --micro-batches 2 "
    "--steps 6 --lr 3e-3 --grad-clip 0.5";

class RedisRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::RedisServer::Binary().empty()) {
      GTEST_SKIP() << "redis-server is not installed (tools/bootstrap.sh installs it)";
    }
    std::string why;
    ASSERT_TRUE(redis_.Start(&why)) << why;
  }

  // `strata launch -n N -- strata train ... [--rendezvous R]`; the per-step losses from
  // rank 0's --json (empty when the run failed; *run gets what it printed).
  std::vector<double> Train(int ranks, const std::string& rendezvous, CliRun* run = nullptr) {
    const std::string json = dir_.File("run" + std::to_string(runs_++) + ".json");
    testing::CliRunOptions o;
    o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
    const CliRun r = testing::RunCli("launch -n " + std::to_string(ranks) + " --grace 1 -- " +
                                         kCli + " " + kModel + " --comm-timeout 30 --json " + json +
                                         (rendezvous.empty() ? "" : " --rendezvous " + rendezvous),
                                     o);
    if (run != nullptr) *run = r;
    std::vector<double> losses;
    if (r.exit_code != 0) return losses;
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    if (!j.is_object()) return losses;
    for (const auto& s : j["steps"]) losses.push_back(s["loss"].get<double>());
    return losses;
  }

  testing::RedisServer redis_;
  testing::TempDir dir_{"strata-redis"};
  int runs_ = 0;
};

TEST_F(RedisRendezvousTest, TwoAndFourRanksGiveTheFileRendezvousLosses) {
  for (int ranks : {2, 4}) {
    CliRun run;
    const std::vector<double> file = Train(ranks, "");
    const std::vector<double> redis =
        Train(ranks, redis_.Url("losses" + std::to_string(ranks)), &run);
    ASSERT_EQ(redis.size(), 6u) << run.output;
    ASSERT_EQ(file.size(), 6u);
    // Same world size, same collectives in the same order: the same bits.
    EXPECT_EQ(redis, file) << ranks << " ranks";
  }
}

TEST_F(RedisRendezvousTest, AFinishedRunLeavesNoKeySoTheSamePrefixRunsAgain) {
  CliRun run;
  const std::vector<double> first = Train(2, redis_.Url("again"), &run);
  ASSERT_EQ(first.size(), 6u) << run.output;
  EXPECT_EQ(redis_.Cli("--scan --pattern 'again/*'"), "");
  const std::vector<double> second = Train(2, redis_.Url("again"), &run);
  ASSERT_EQ(second.size(), 6u) << run.output;
  EXPECT_EQ(first, second);
  EXPECT_EQ(redis_.Cli("DBSIZE"), "0\n");
}

TEST_F(RedisRendezvousTest, AStaleKeyIsTakenOverUnderLaunchAndRefusedWithoutASecret) {
  // What a run killed during start-up leaves: rank 0's join key, unsigned.
  ASSERT_EQ(redis_.Cli("SET stale/strata-train/join/0 v1"), "OK\n");
  // strata launch gives its ranks a run secret: the key does not verify with it, so it is
  // not this run's, and rank 0 takes it over (a stale or planted key cannot block a prefix).
  CliRun run;
  const std::vector<double> losses = Train(2, redis_.Url("stale"), &run);
  EXPECT_EQ(losses.size(), 6u) << run.output;
  EXPECT_TRUE(Contains(run.output, "replacing key 'stale/strata-train/join/0'")) << run.output;
  // Ranks without a secret (started by torchrun or srun) cannot tell another run's key from
  // their own: refused, naming it and how to delete it.
  ASSERT_EQ(redis_.Cli("SET stale/strata-train/join/0 v1"), "OK\n");
  testing::CliRunOptions o;
  o.unset_env = {"LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS", "STRATA_RUN_SECRET"};
  o.timeout_s = 60;
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  run = testing::RunCli(kModel + " --comm-timeout 30 --rendezvous " + redis_.Url("stale"), o);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) ::unsetenv(v);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_TRUE(Contains(run.output, "key 'stale/strata-train/join/0' already exists")) << run.output;
  EXPECT_TRUE(Contains(run.output, "--scan --pattern 'stale/*'")) << run.output;
  // Another prefix on the same server is not disturbed.
  const std::vector<double> other = Train(2, redis_.Url("fresh"), &run);
  EXPECT_EQ(other.size(), 6u) << run.output;
}

TEST_F(RedisRendezvousTest, RedisGoingAwayDuringStartUpIsNamed) {
  // Rank 0 of 2 alone: it joins and waits for rank 1, which never comes; the server stops.
  testing::CliRunOptions o;
  o.unset_env = {"LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  o.timeout_s = 60;
  CliRun run;
  const auto start = std::chrono::steady_clock::now();
  // The rank variables for the one child (RunCli's command sees this process's environment).
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  std::thread rank0([&] {
    run = testing::RunCli(kModel + " --comm-timeout 40 --rendezvous " + redis_.Url("gone"), o);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  redis_.Stop();
  rank0.join();
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) ::unsetenv(v);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_LT(seconds, 20) << "waited for the timeout instead of noticing: " << run.output;
  EXPECT_TRUE(Contains(run.output, "Redis server at 127.0.0.1:" + std::to_string(redis_.port()) +
                                       " stopped answering"))
      << run.output;
}

}  // namespace
}  // namespace strata
