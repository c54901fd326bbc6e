// Tests of `strata bench comm`: the built strata binary (STRATA_CLI_PATH) measures the
// collectives across ranks started by `strata launch`, and its JSON is checked for what the
// table promises: every size of every collective, nccl-tests' bus factors, sizes that split
// over the ranks, and no wrong element.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::Contains;

const std::string kCli = STRATA_CLI_PATH;

CliRun RunStrata(const std::string& args, const std::string& err_path = "") {
  testing::CliRunOptions o;
  o.timeout_s = 120;
  if (!err_path.empty()) {
    o.stderr_to = testing::CliStderr::kFile;
    o.stderr_path = err_path;
  }
  o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  return testing::RunCli(args, o);
}

// Checks a run's JSON for `ranks` ranks, sizes min..max by x4, the four collectives.
void CheckJson(const nlohmann::json& j, int ranks, uint64_t min_bytes, uint64_t max_bytes) {
  ASSERT_EQ(j.at("ranks").get<int>(), ranks);
  EXPECT_EQ(j.at("wrong").get<uint64_t>(), 0u);
  std::set<std::string> ops;
  size_t rows = 0;
  for (const auto& r : j.at("results")) {
    ++rows;
    const std::string op = r.at("op");
    ops.insert(op);
    const uint64_t bytes = r.at("bytes"), count = r.at("count");
    EXPECT_EQ(bytes, count * 4);
    EXPECT_EQ(count % uint64_t(ranks), 0u) << op << " " << bytes;
    EXPECT_GE(bytes + 4 * ranks, min_bytes);
    EXPECT_LE(bytes, max_bytes);
    EXPECT_EQ(r.at("wrong").get<uint64_t>(), 0u) << op << " " << bytes;
    const double n = ranks;
    const double factor = op == "all-reduce"  ? 2 * (n - 1) / n
                          : op == "broadcast" ? 1
                                              : (n - 1) / n;
    EXPECT_DOUBLE_EQ(r.at("bus_factor").get<double>(), factor) << op;
    const double time_us = r.at("time_us"), algbw = r.at("algbw_gbps"), busbw = r.at("busbw_gbps");
    EXPECT_GT(time_us, 0) << op << " " << bytes;
    EXPECT_NEAR(algbw, double(bytes) / (time_us * 1e3), 1e-9 + 1e-9 * algbw);
    EXPECT_NEAR(busbw, algbw * factor, 1e-12 + 1e-9 * busbw);
  }
  EXPECT_EQ(ops,
            (std::set<std::string>{"all-gather", "reduce-scatter", "all-reduce", "broadcast"}));
  // 64 B .. 64 KiB by x4: 6 sizes per collective.
  EXPECT_EQ(rows, 4u * 6u);
}

TEST(BenchComm, TwoRanksUnderLaunchCheckEveryResult) {
  CliRun r =
      RunStrata("launch -n 2 --output rank0 -- " + kCli +
                    " bench comm --min-bytes 64 --max-bytes 64K --factor 4 --iters 3 --warmup 1 "
                    "--tcp-bytes 8M --json -",
                "/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  CheckJson(j, 2, 64, 64 << 10);
  EXPECT_GT(j.at("tcp_bound_gbps").get<double>(), 0);
}

TEST(BenchComm, ThreeRanksRoundSizesToTheRankCountAndPrintTheTable) {
  CliRun r =
      RunStrata("launch -n 3 --output rank0 -- " + kCli +
                    " bench comm --min-bytes 64 --max-bytes 64K --factor 4 --iters 2 --warmup 0 "
                    "--tcp-bytes 1M",
                "/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "# strata bench comm: 3 rank(s)")) << r.output;
  EXPECT_TRUE(Contains(r.output, "busbw(GB/s)")) << r.output;
  EXPECT_TRUE(Contains(r.output, "# gloo reduce-scatter")) << r.output;
  EXPECT_TRUE(Contains(r.output, "# Out of bounds values : 0 OK")) << r.output;
  // 64 B = 16 floats, rounded down to 15 (a multiple of 3): 60 B.
  EXPECT_TRUE(Contains(r.output, "            60           15 ")) << r.output;
}

TEST(BenchComm, OneRankWithoutALauncher) {
  CliRun r = RunStrata("bench comm --min-bytes 64 --max-bytes 64K --factor 4 --iters 2 --json -",
                       "/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  CheckJson(j, 1, 64, 64 << 10);
  EXPECT_EQ(j.at("tcp_bound_gbps").get<double>(), 0);  // no second rank to copy to
}

TEST(BenchComm, BadFlagsAreNamed) {
  CliRun op = RunStrata("bench comm --op all-to-all");
  EXPECT_EQ(op.exit_code, 1);
  EXPECT_TRUE(Contains(op.output, "--op all-to-all: expected all-gather")) << op.output;
  CliRun factor = RunStrata("bench comm --factor 1");
  EXPECT_EQ(factor.exit_code, 1);
  EXPECT_TRUE(Contains(factor.output, "--factor")) << factor.output;
  CliRun range = RunStrata("bench comm --min-bytes 1M --max-bytes 1K");
  EXPECT_EQ(range.exit_code, 1);
  EXPECT_TRUE(Contains(range.output, "expected 0 < min <= max")) << range.output;
  CliRun backend = RunStrata("bench comm --backend mpi");
  EXPECT_EQ(backend.exit_code, 1);
  EXPECT_TRUE(Contains(backend.output, "--backend mpi: expected auto, gloo or nccl"))
      << backend.output;
}

}  // namespace
}  // namespace strata
