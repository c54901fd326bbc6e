// A bf16 master sharded across two ranks (`strata launch -n 2 -- strata bench step
// --master-dtype bf16`): each rank keeps its shard of bf16 values, which are the params the
// ranks gather (half the H2D bytes of fp32 params), writes exactly the NVMe bytes its placement
// predicts, and the zero-gradient self-check holds on both ranks (#wrong 0).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::RunCli;
using strata::testing::ShellQuote;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

const std::vector<std::string> kRankVars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                            "STRATA_RENDEZVOUS"};

TEST(BenchStepBf16MasterMultirank, TwoRanksShardTheBf16Master) {
  strata::testing::TempDir tmp("strata-bench-bf16-mr");
  auto run = [&](const std::string& name, const std::string& flags) {
    const std::string json = tmp.File(name + ".json");
    strata::testing::CliRunOptions options;
    options.timeout_s = 300;
    options.unset_env = kRankVars;
    const auto r =
        RunCli("launch -n 2 -- " + std::string(STRATA_CLI_PATH) +
                   " bench step --blocks 3 --block-bytes 64K --compute-ms 0 --steps 3 --device-mem "
                   "unlimited --host-mem 512K --grad-clip 0 " +
                   flags + " --json" + ShellQuote({json, "--nvme", tmp.File(name + "/{rank}")}),
               options);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    nlohmann::json j;
    if (r.exit_code == 0) j = nlohmann::json::parse(Slurp(json), nullptr, false);
    return j;
  };
  const nlohmann::json fp32 = run("fp32", "");
  const nlohmann::json bf16 = run("bf16", "--state-dtype int8 --master-dtype bf16");
  ASSERT_TRUE(fp32.is_object() && bf16.is_object());
  const auto& a = fp32["steps"].back();
  const auto& b = bf16["steps"].back();
  EXPECT_EQ(a["wrong"], 0);
  EXPECT_EQ(b["wrong"], 0);
  EXPECT_EQ(b["ranks"].size(), 2u);
  EXPECT_EQ(2 * b["bytes"]["h2d"].get<double>(), a["bytes"]["h2d"].get<double>());
  EXPECT_EQ(b["bytes"]["nvme_write"], bf16["placement"]["predicted_bytes"]["nvme_write"]);
  EXPECT_LE(b["bytes"]["nvme_write"].get<double>(), 0.36 * a["bytes"]["nvme_write"].get<double>());
}

}  // namespace
