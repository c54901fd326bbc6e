// Tests of `strata launch`: it runs the built strata binary (STRATA_CLI_PATH) on real
// commands: shell one-liners, and this test binary itself as a rank that builds a Gloo
// communicator from the environment launch sets up.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/comm.h"
#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

using testing::CliRun;
using testing::Contains;

// `strata <args>`, standard error merged into the output unless `stderr_to` says otherwise.
CliRun Shell(const std::string& args, testing::CliStderr stderr_to = testing::CliStderr::kMerged) {
  testing::CliRunOptions options;
  options.stderr_to = stderr_to;
  return testing::RunCli(args, options);
}

std::string Self() {
  std::vector<char> buf(4096);
  ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

TEST(Launch, SetsRankVariablesAndPrefixesOutput) {
  CliRun r = Shell(
      "launch -n 3 -- sh -c 'echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK "
      "lws=$LOCAL_WORLD_SIZE rdzv=$STRATA_RENDEZVOUS; echo err$RANK >&2'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    std::string ks = std::to_string(k);
    EXPECT_TRUE(Contains(
        r.output, "[rank " + ks + "] rank=" + ks + " world=3 local=" + ks + " lws=3 rdzv=file:"))
        << r.output;
    EXPECT_TRUE(Contains(r.output, "[rank " + ks + "] err" + ks + "\n")) << r.output;
  }
  // One rendezvous folder shared by all ranks.
  size_t a = r.output.find("rdzv=");
  std::string folder = r.output.substr(a, r.output.find('\n', a) - a);
  size_t count = 0;
  for (size_t p = r.output.find(folder); p != std::string::npos; p = r.output.find(folder, p + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 3u) << r.output;
}

TEST(Launch, Rank0OutputModeForwardsOnlyRank0Stdout) {
  CliRun r = Shell("launch -n 2 --output rank0 -- sh -c 'echo out$RANK; echo err$RANK >&2'",
                   testing::CliStderr::kDiscarded);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "out0\n");
}

TEST(Launch, FailedRankStopsTheOthersAndIsNamed) {
  // Rank 1 fails at once; the others would sleep for two minutes unless stopped.
  CliRun r = Shell(
      "launch -n 3 --grace 0.5 -- sh -c 'if [ $RANK = 1 ]; then echo dying >&2; exit 3; fi; "
      "exec sleep 120'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(Contains(r.output, "[rank 1] dying")) << r.output;
  EXPECT_TRUE(Contains(r.output, "failed: rank 1 of 3 exited with code 3")) << r.output;
  EXPECT_TRUE(Contains(r.output, "sending SIGTERM")) << r.output;
}

TEST(Launch, KilledRankIsReportedWithItsSignal) {
  CliRun r = Shell(
      "launch -n 2 --grace 0.2 -- sh -c 'if [ $RANK = 0 ]; then kill -9 $$; fi; "
      "exec sleep 120'");
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_TRUE(Contains(r.output, "failed: rank 0 of 2 was killed by signal 9")) << r.output;
}

TEST(Launch, RejectsBadArguments) {
  CliRun zero = Shell("launch -n 0 -- true");
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_TRUE(Contains(zero.output, "-n 0")) << zero.output;
  CliRun no_cmd = Shell("launch -n 2");
  EXPECT_NE(no_cmd.exit_code, 0);
  CliRun bad_output = Shell("launch -n 1 --output all -- true");
  EXPECT_NE(bad_output.exit_code, 0);
  EXPECT_TRUE(Contains(bad_output.output, "--output all")) << bad_output.output;
  CliRun missing = Shell("launch -n 2 -- /nonexistent/program");
  EXPECT_EQ(missing.exit_code, 127) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "cannot run '/nonexistent/program'")) << missing.output;
}

// Run by `strata launch` (below) as each rank: discovers itself from the environment,
// joins through STRATA_RENDEZVOUS and all-reduces its rank number.
TEST(LaunchChild, AllReduceRanks) {
  if (std::getenv("STRATA_LAUNCH_TEST_CHILD") == nullptr) GTEST_SKIP() << "run by launch";
  Result<RankInfo> info = RankInfoFromEnv();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const char* rdzv_text = std::getenv("STRATA_RENDEZVOUS");
  ASSERT_NE(rdzv_text, nullptr);
  Result<RendezvousSpec> rdzv = ParseRendezvous(rdzv_text);
  ASSERT_TRUE(rdzv.ok()) << rdzv.status().ToString();
  CommOptions opts;
  opts.rank = *info;
  opts.rendezvous = *rdzv;
  const std::string mode = std::getenv("STRATA_LAUNCH_TEST_CHILD");
  // "hang": the survivors give up on the silent rank after 2 s.
  opts.timeout = mode == "hang" ? std::chrono::seconds(2) : std::chrono::seconds(30);
  auto comm = CreateGlooCommunicator(opts);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  if (mode == "kill" || mode == "hang") {
    ASSERT_TRUE((*comm)->Barrier().Wait().ok());
    // Rank 1 dies only once every survivor is past the barrier (else its death could
    // fail a survivor's barrier instead of the all-reduce under test).
    if (info->rank == 1) {
      for (int r = 0; r < info->world_size; ++r) {
        if (r != 1) {
          ASSERT_TRUE((*comm)->store()->Get("ready/" + std::to_string(r), 30s).ok());
        }
      }
      if (mode == "kill") ::raise(SIGKILL);
      for (;;) ::pause();  // hangs: alive, connected, silent (until launch stops it)
    }
    ASSERT_TRUE((*comm)->store()->Set("ready/" + std::to_string(info->rank), "1").ok());
    std::vector<float> big(50000, 1.0f);
    Status s =
        (*comm)
            ->AllReduce(big.data(), big.data(), big.size(), CommDataType::kFloat32, ReduceOp::kSum)
            .Wait();
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    ASSERT_FALSE(s.ok());
    std::exit(4);  // what a training run does with a comm error
  }
  float v = static_cast<float>(info->rank + 1);
  ASSERT_TRUE((*comm)->AllReduce(&v, &v, 1, CommDataType::kFloat32, ReduceOp::kSum).Wait().ok());
  std::printf("sum=%g world=%d source=%s\n", v, info->world_size, info->source.c_str());
}

TEST(Launch, RanksFormACommunicatorFromTheEnvironment) {
  std::string self = Self();
  ASSERT_FALSE(self.empty());
  ::setenv("STRATA_LAUNCH_TEST_CHILD", "1", 1);
  CliRun r = Shell("launch -n 3 --output rank0 -- " + self +
                   " --gtest_filter=LaunchChild.AllReduceRanks --gtest_brief=1");
  ::unsetenv("STRATA_LAUNCH_TEST_CHILD");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "sum=6 world=3 source=torchrun")) << r.output;
}

// A rank that dies under launch: the survivors fail with an error naming it, and launch
// reports the dead rank (the first to fail) as the cause.
TEST(Launch, DeadRankIsNamedByTheSurvivorsAndByLaunch) {
  std::string self = Self();
  ASSERT_FALSE(self.empty());
  ::setenv("STRATA_LAUNCH_TEST_CHILD", "kill", 1);
  CliRun r = Shell("launch -n 3 --grace 30 -- " + self +
                   " --gtest_filter=LaunchChild.AllReduceRanks --gtest_brief=1");
  ::unsetenv("STRATA_LAUNCH_TEST_CHILD");
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_TRUE(Contains(r.output, "failed: rank 1 of 3 was killed by signal 9")) << r.output;
  // Both survivors stopped by themselves (well within the grace period), naming rank 1.
  EXPECT_TRUE(Contains(r.output, "all-reduce on rank 0 of 3 failed: lost rank 1")) << r.output;
  EXPECT_TRUE(Contains(r.output, "all-reduce on rank 2 of 3 failed: lost rank 1")) << r.output;
  EXPECT_FALSE(Contains(r.output, "sending SIGTERM")) << r.output;
}

// A rank that hangs (alive, connected, silent) under launch: the survivors give up after
// their comm timeout saying which rank sent nothing and for how long, and launch blames the
// rank that hung (which it had to stop), not the first survivor that exited.
TEST(Launch, HungRankIsNamedByTheSurvivorsAndByLaunch) {
  std::string self = Self();
  ASSERT_FALSE(self.empty());
  ::setenv("STRATA_LAUNCH_TEST_CHILD", "hang", 1);
  CliRun r = Shell("launch -n 3 --grace 1 -- " + self +
                   " --gtest_filter=LaunchChild.AllReduceRanks --gtest_brief=1");
  ::unsetenv("STRATA_LAUNCH_TEST_CHILD");
  EXPECT_TRUE(Contains(r.output, "rank 1 sent nothing for 2 s")) << r.output;
  EXPECT_TRUE(Contains(r.output, "failed: rank 1 of 3 hung")) << r.output;
  EXPECT_FALSE(Contains(r.output, "failed: rank 0 of 3")) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace strata
