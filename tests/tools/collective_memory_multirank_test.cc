// `--collective-memory host` against `--collective-memory device` across 2 ranks on the CPU
// (real processes under `strata launch`, Gloo over loopback): the engine gathers parameters
// and reduces gradients in pinned host buffers or in (host) device memory, and the
// per-step losses of `strata train` must be bit-for-bit equal either way, while the bytes
// that cross H2D show that each run really took its own path (device: 1/2 of each block).
// `strata bench step` takes the same flag and its data check stays clean in both modes.
// Runs the built strata binary (STRATA_CLI_PATH).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::CliRun;

class CollectiveMemoryTest : public ::testing::Test {
 protected:
  // `strata launch -n 2 -- strata <args> --collective-memory <memory>`; the JSON rank 0
  // wrote to `json` (train) or printed (bench step, `json` empty).
  nlohmann::json Run(const std::string& args, const std::string& memory, const std::string& json) {
    const std::string strata = STRATA_CLI_PATH;
    // Standard error apart, so that the JSON on standard output stays parseable.
    strata::testing::CliRunOptions options;
    options.stderr_to = strata::testing::CliStderr::kFile;
    options.stderr_path = dir_.File("stderr");
    const CliRun r = strata::testing::RunCli("launch -n 2 --output rank0 -- " + strata + " " +
                                                 args + " --collective-memory " + memory +
                                                 (json.empty() ? "" : " --json " + json),
                                             options);
    EXPECT_EQ(r.exit_code, 0) << r.output << r.err;
    if (r.exit_code != 0) return nlohmann::json();
    if (json.empty()) {
      const size_t brace = r.output.find('{');
      if (brace == std::string::npos) {
        ADD_FAILURE() << "no JSON in\n" << r.output << r.err;
        return nlohmann::json();
      }
      return nlohmann::json::parse(r.output.substr(brace), nullptr, /*allow_exceptions=*/false);
    }
    std::ifstream f(json);
    if (!f) {
      ADD_FAILURE() << "no " << json << "\n" << r.output << r.err;
      return nlohmann::json();
    }
    return nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  }

  strata::testing::TempDir dir_{"strata-cm"};
};

TEST_F(CollectiveMemoryTest, TrainLossesAreBitIdenticalInHostAndDeviceMemory) {
  // Clipping on, so the norm (a host-side collective) is in play too; two micro-batches, so
  // gradients accumulate across reduce-scatters.
  const std::string model =
      "train --layers 2 --d-model 32 --heads 2 --seq-len 16 --batch 4 --micro-batches 2 "
      "--steps 8 --lr 3e-3 --grad-clip 0.5";
  const nlohmann::json host = Run(model, "host", dir_.File("host.json"));
  const nlohmann::json device = Run(model, "device", dir_.File("device.json"));
  ASSERT_TRUE(host.is_object() && device.is_object());
  // Each run reports the mode the engine used (and the backend: Gloo on the CPU).
  EXPECT_EQ(host["config"]["collective_memory"], "host");
  EXPECT_EQ(device["config"]["collective_memory"], "device");
  EXPECT_EQ(host["config"]["world_size"], 2);
  EXPECT_EQ(device["config"]["comm_backend"], "gloo");
  ASSERT_EQ(host["steps"].size(), 8u);
  ASSERT_EQ(device["steps"].size(), 8u);
  uint64_t host_h2d = 0, device_h2d = 0;
  for (size_t i = 0; i < 8; ++i) {
    // Exact equality of the doubles --json printed (nlohmann writes them round-trip exact).
    EXPECT_EQ(host["steps"][i]["loss"].get<double>(), device["steps"][i]["loss"].get<double>())
        << "step " << i + 1;
    EXPECT_EQ(host["steps"][i]["grad_norm"].get<double>(),
              device["steps"][i]["grad_norm"].get<double>())
        << "step " << i + 1;
    host_h2d += host["steps"][i]["bytes"]["h2d"].get<uint64_t>();
    device_h2d += device["steps"][i]["bytes"]["h2d"].get<uint64_t>();
  }
  // The paths differ: in device memory each rank copies only its half of every block in.
  EXPECT_GT(device_h2d, 0u);
  EXPECT_LT(device_h2d, host_h2d);
}

TEST_F(CollectiveMemoryTest, BenchStepDataCheckIsCleanInBothModes) {
  for (const char* memory : {"host", "device"}) {
    const nlohmann::json j = Run(
        "bench step --blocks 3 --block-bytes 96K --compute-ms 0 --steps 2 --json -", memory, "");
    ASSERT_TRUE(j.is_object()) << memory;
    EXPECT_EQ(j["config"]["collective_memory"], memory);
    EXPECT_EQ(j["config"]["world_size"], 2);
    ASSERT_EQ(j["steps"].size(), 2u) << memory;
    EXPECT_EQ(j["steps"][1]["wrong"], 0) << memory;
  }
}

}  // namespace
