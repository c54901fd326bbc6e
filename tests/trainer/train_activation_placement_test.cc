// Every placement of layer-major activations the planner chooses trains bit for bit like the
// run that keeps them all in memory (issue 45, round 4): micro-batches keeping their own slot
// on the device, sharing one with their activations in pinned host slots, and spilling some
// of those to NVMe, for 2 steps each, over a grid of --host-mem and --device-mem. A budget
// the planner cannot place is refused before the first step, never failed in one.
//
// Before: with the activations partly on the device and partly on NVMe (--host-mem 1200K
// --device-mem 1M) step 1 failed with "StashActivation: activation 15 is live already": the
// residual gradient's key, fetched for the last time while its spill was in flight, lingered
// until the write ended, and the next block's stash of the same key was refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::Contains;
using strata::testing::RunCli;
using strata::testing::ShellQuote;

const std::vector<std::string> kRun = {"train",     "--layers",    "2",
                                       "--d-model", "64",          "--heads",
                                       "2",         "--seq-len",   "32",
                                       "--batch",   "4",           "--micro-batches",
                                       "4",         "--recompute", "--micro-batch-order",
                                       "layer",     "--steps",     "2"};

std::vector<double> Losses(const std::string& json_path) {
  std::ifstream f(json_path);
  const nlohmann::json js = nlohmann::json::parse(f);
  std::vector<double> out;
  for (const auto& s : js["steps"]) out.push_back(s["loss"].get<double>());
  return out;
}

TEST(TrainActivationPlacementTest, EveryPlacementTrainsLikeTheInMemoryRun) {
  strata::testing::TempDir tmp("strata-actplace");
  strata::testing::CliRunOptions o;
  o.timeout_s = 300;
  std::vector<std::string> ref = kRun;
  ref.insert(ref.end(), {"--json", tmp.path() + "/ref.json"});
  const auto in_memory = RunCli(ShellQuote(ref), o);
  ASSERT_EQ(in_memory.exit_code, 0) << in_memory.output;
  const std::vector<double> expected = Losses(tmp.path() + "/ref.json");
  ASSERT_EQ(expected.size(), 2u);
  int offloaded = 0, mixed = 0;
  for (const std::string host : {"900K", "1200K", "2M", "8M"}) {
    for (const std::string device : {"700K", "1M", "2M"}) {
      SCOPED_TRACE("--host-mem " + host + " --device-mem " + device);
      const std::string nvme = tmp.path() + "/n" + host + device;
      std::filesystem::create_directory(nvme);
      const std::string json = nvme + ".json";
      std::vector<std::string> args = kRun;
      args.insert(args.end(),
                  {"--nvme", nvme, "--host-mem", host, "--device-mem", device, "--json", json});
      const auto r = RunCli(ShellQuote(args), o);
      if (r.exit_code != 0) {
        // Refused up front: the budgets cannot place it.
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_TRUE(Contains(r.output, "OutOfMemory")) << r.output;
        EXPECT_FALSE(Contains(r.output, "step     1")) << r.output;
        continue;
      }
      EXPECT_EQ(Losses(json), expected) << r.output;
      if (Contains(r.output, "micro-batches offloaded")) ++offloaded;
      if (Contains(r.output, "keeps its activations on the device") ||
          Contains(r.output, "keep their activations on the device")) {
        ++mixed;
      }
    }
  }
  // The grid reaches the offloaded placements, the mixed one (device slots with the rest in
  // the engine) among them.
  EXPECT_GE(offloaded, 4);
  EXPECT_GE(mixed, 2);
}

}  // namespace
