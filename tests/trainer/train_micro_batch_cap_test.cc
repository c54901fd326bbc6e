// `strata train` with offloaded activations reports the most micro-batches its budgets admit
// (the start-up line and --json's config.max_micro_batches / max_micro_batches_bound), and
// the figure is exact: a run at it trains, and one micro-batch more is refused up front with
// an error that names the figure and the budget to raise.
#include <gtest/gtest.h>

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

// Layer-major with the activations offloaded (forced), one step of a tiny model.
const std::vector<std::string> kRun = {"train",
                                       "--layers",
                                       "2",
                                       "--d-model",
                                       "32",
                                       "--heads",
                                       "2",
                                       "--seq-len",
                                       "16",
                                       "--batch",
                                       "2",
                                       "--steps",
                                       "1",
                                       "--lr",
                                       "1e-3",
                                       "--recompute",
                                       "--micro-batch-order",
                                       "layer",
                                       "--offload-activations",
                                       "on"};

strata::testing::CliRun Train(const std::vector<std::string>& extra) {
  std::vector<std::string> args = kRun;
  args.insert(args.end(), extra.begin(), extra.end());
  strata::testing::CliRunOptions o;
  o.timeout_s = 60;
  return RunCli(ShellQuote(args), o);
}

nlohmann::json Json(const std::string& path) {
  std::ifstream f(path);
  return f ? nlohmann::json::parse(f) : nlohmann::json();
}

// Without NVMe every activation stays in host memory: --host-mem bounds the micro-batches.
// With --device-mem 128K the device has no room for a micro-batch's own activation slot;
// with 256K some keep theirs on the device, and the most counts them too.
TEST(TrainMicroBatchCapTest, HostBoundIsExact) {
  strata::testing::TempDir tmp("strata-mbcap");
  const std::string dir = tmp.path();
  for (const std::string device : {"128K", "256K"}) {
    SCOPED_TRACE("--device-mem " + device);
    // The states' and two micro-batches' minimum, from a roomy run.
    auto roomy = Train({"--device-mem", device, "--micro-batches", "2", "--host-mem", "64M",
                        "--json", dir + "/r.json"});
    ASSERT_EQ(roomy.exit_code, 0) << roomy.output;
    const nlohmann::json r = Json(dir + "/r.json");
    ASSERT_GT(r["config"]["activation_slots"].get<int>(), 0) << roomy.output;
    EXPECT_EQ(r["config"]["max_micro_batches_bound"], "host");
    const uint64_t min2 = r["placement"]["host_min_bytes"];
    const uint64_t slot = r["placement"]["activation_slot_bytes"];
    const int count2 = r["placement"]["activation_count"];  // two micro-batches' keys
    ASSERT_GT(count2, 0);
    const int keys = count2 / 2;

    // Room for three more micro-batches' activations and half a slot: the host budget holds
    // five offloaded micro-batches.
    const std::string host = std::to_string(min2 + 3 * keys * slot + slot / 2);
    auto at2 = Train({"--device-mem", device, "--micro-batches", "2", "--host-mem", host, "--json",
                      dir + "/a.json"});
    ASSERT_EQ(at2.exit_code, 0) << at2.output;
    const nlohmann::json a = Json(dir + "/a.json");
    EXPECT_EQ(a["config"]["max_micro_batches_bound"], "host");
    EXPECT_EQ(a["placement"]["activation_host_capacity"].get<int64_t>(), 5 * keys);
    ASSERT_TRUE(a["config"]["max_micro_batches"].is_number()) << a["config"];
    const int64_t most = a["config"]["max_micro_batches"];
    if (device == "128K") {
      EXPECT_EQ(most, 5) << at2.output;
    }
    if (device == "256K") {
      EXPECT_GT(most, 5) << at2.output;
    }
    EXPECT_TRUE(Contains(at2.output, "# micro-batches: at most " + std::to_string(most) +
                                         " micro-batches: --host-mem holds"))
        << at2.output;

    // At the most: it trains, with five micro-batches' activations offloaded.
    auto at_most = Train({"--device-mem", device, "--micro-batches", std::to_string(most),
                          "--host-mem", host, "--json", dir + "/m.json"});
    ASSERT_EQ(at_most.exit_code, 0) << at_most.output;
    const nlohmann::json m = Json(dir + "/m.json");
    EXPECT_EQ(m["config"]["max_micro_batches"], most);
    EXPECT_EQ(m["placement"]["activation_count"].get<int64_t>(), 5 * keys) << at_most.output;
    EXPECT_EQ(m["steps"].size(), 1u);

    // One more: refused before any step, naming the most and the budget.
    auto above = Train({"--device-mem", device, "--micro-batches", std::to_string(most + 1),
                        "--host-mem", host, "--json", dir + "/x.json"});
    EXPECT_EQ(above.exit_code, 1) << above.output;
    EXPECT_TRUE(Contains(above.output, "--micro-batches " + std::to_string(most + 1) +
                                           " is more than the budgets admit"))
        << above.output;
    EXPECT_TRUE(Contains(above.output, "at most " + std::to_string(most) + " micro-batches"))
        << above.output;
    EXPECT_TRUE(Contains(above.output, "raise --host-mem or give --nvme")) << above.output;
    EXPECT_FALSE(Contains(above.output, "step     1/")) << above.output;
  }
}

// With NVMe the scratch files take what the host cannot: the folder's free space bounds the
// micro-batches, far beyond what the host holds; with no --host-mem nothing does.
TEST(TrainMicroBatchCapTest, NvmeAndUnboundedAreReported) {
  strata::testing::TempDir tmp("strata-mbcap");
  const std::string dir = tmp.path();
  auto nvme = Train({"--device-mem", "128K", "--micro-batches", "4", "--host-mem", "1M", "--nvme",
                     dir + "/store", "--json", dir + "/n.json"});
  ASSERT_EQ(nvme.exit_code, 0) << nvme.output;
  const nlohmann::json n = Json(dir + "/n.json");
  EXPECT_EQ(n["config"]["max_micro_batches_bound"], "nvme") << nvme.output;
  EXPECT_GT(n["placement"]["activation_nvme_capacity"].get<int64_t>(),
            n["placement"]["activation_host_capacity"].get<int64_t>());
  EXPECT_GT(n["config"]["max_micro_batches"].get<int64_t>(), 4);
  EXPECT_TRUE(Contains(nvme.output, "the --nvme folders' free space holds")) << nvme.output;

  auto unbounded =
      Train({"--device-mem", "128K", "--micro-batches", "3", "--json", dir + "/u.json"});
  ASSERT_EQ(unbounded.exit_code, 0) << unbounded.output;
  const nlohmann::json u = Json(dir + "/u.json");
  EXPECT_EQ(u["config"]["max_micro_batches_bound"], "unbounded");
  EXPECT_TRUE(u["config"]["max_micro_batches"].is_null());
  EXPECT_TRUE(Contains(unbounded.output, "no budget bounds the micro-batches")) << unbounded.output;
}

}  // namespace
