// Crash trials with offloaded activations: a layer-major `strata train` whose activations
// spill to the NVMe scratch file (several micro-batches, --host-mem at its minimum, so the
// stash keeps 3 host slots), SIGKILLed inside the activation traffic (a spill's write in
// flight, a read back in flight: STRATA_TEST_KILL_AT's activation points) and at a commit
// that overlaps it. The killed run leaves its scratch file behind; `--resume` must take it
// over, reproduce the uninterrupted run's losses bit for bit from the last commit, and
// remove it when it closes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
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
                                       "--lr",
                                       "3e-3",
                                       "--device-mem",
                                       "128K",
                                       "--recompute",
                                       "--micro-batches",
                                       "4",
                                       "--micro-batch-order",
                                       "layer",
                                       "--offload-activations",
                                       "on",
                                       "--durable"};

const char* kScratch = "/strata.activations.rank0.0-of-1";

strata::testing::CliRun Train(const std::vector<std::string>& extra, const std::string& kill_at) {
  std::vector<std::string> args = kRun;
  args.insert(args.end(), extra.begin(), extra.end());
  if (!kill_at.empty()) ::setenv("STRATA_TEST_KILL_AT", kill_at.c_str(), 1);
  strata::testing::CliRunOptions o;
  o.timeout_s = 120;
  auto r = RunCli(ShellQuote(args), o);
  if (!kill_at.empty()) ::unsetenv("STRATA_TEST_KILL_AT");
  return r;
}

nlohmann::json Json(const std::string& path) {
  std::ifstream f(path);
  return f ? nlohmann::json::parse(f) : nlohmann::json();
}

TEST(TrainActivationCrashTest, KilledInTheActivationTrafficResumesBitForBit) {
  strata::testing::TempDir tmp("strata-actcrash");
  const std::string dir = tmp.path();
  // The host minimum of this run with NVMe: the states' and the stash's 3 slots.
  const auto probe = Train({"--steps", "1", "--host-mem", "64M", "--nvme", dir + "/probe", "--json",
                            dir + "/probe.json"},
                           "");
  ASSERT_EQ(probe.exit_code, 0) << probe.output;
  const std::string host =
      std::to_string(Json(dir + "/probe.json")["placement"]["host_min_bytes"].get<uint64_t>());

  const auto ref_run = Train(
      {"--steps", "6", "--host-mem", host, "--nvme", dir + "/ref", "--json", dir + "/ref.json"},
      "");
  ASSERT_EQ(ref_run.exit_code, 0) << ref_run.output;
  const nlohmann::json ref = Json(dir + "/ref.json");
  ASSERT_EQ(ref["steps"].size(), 6u);
  EXPECT_GT(ref["config"]["activation_slots"].get<int>(), 0) << ref_run.output;
  EXPECT_EQ(ref["placement"]["activation_host_slots"], 3) << ref_run.output;
  // Every step spills and reads back.
  for (const auto& s : ref["steps"]) {
    ASSERT_GT(s["activation_bytes"]["nvme_write"].get<uint64_t>(), 0u) << s;
    ASSERT_GT(s["activation_bytes"]["nvme_read"].get<uint64_t>(), 0u) << s;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/ref" + kScratch));
  const uint64_t per_step = ref["steps"][0]["activation_bytes"]["nvme_write"].get<uint64_t>() /
                            ref["placement"]["activation_slot_bytes"].get<uint64_t>();
  ASSERT_GT(per_step, 2u);

  // Spills (and reads) per step: the first and a middle one of steps 1, 3 and 5; a resume
  // with the same budgets (it spills, taking the killed run's scratch file over) and, once, a
  // resume with room in host memory for every activation (it leaves the file unused, so it
  // removes it at start).
  struct Trial {
    std::string kill_at;
    bool roomy_resume = false;
  };
  std::vector<Trial> trials;
  for (const char* point : {"activation_write_submitted", "activation_read_submitted"}) {
    for (uint64_t n : {uint64_t(1), 2 * per_step + per_step / 2, 4 * per_step + 1}) {
      trials.push_back({std::string(point) + ":" + std::to_string(n)});
    }
  }
  trials.push_back({"commit_begin:3"});  // the store commits while activations move
  trials.push_back({"activation_write_submitted:" + std::to_string(3 * per_step), true});
  int k = 0;
  for (const Trial& t : trials) {
    SCOPED_TRACE("STRATA_TEST_KILL_AT=" + t.kill_at + (t.roomy_resume ? ", roomy resume" : ""));
    const std::string store = dir + "/c" + std::to_string(k++);
    const auto killed =
        Train({"--steps", "6", "--host-mem", host, "--nvme", store, "--json", store + ".json"},
              t.kill_at);
    ASSERT_EQ(killed.exit_code, 137) << killed.output;
    if (t.kill_at.rfind("activation", 0) == 0) {
      EXPECT_TRUE(std::filesystem::exists(store + kScratch)) << "the killed run left none";
    }
    std::vector<std::string> resume = {"--resume", store, "--json", store + ".resumed.json"};
    if (t.roomy_resume) resume.insert(resume.end(), {"--host-mem", "64M"});
    const auto resumed = Train(resume, "");
    ASSERT_EQ(resumed.exit_code, 0) << killed.output << "\n--- resume:\n" << resumed.output;
    const nlohmann::json j = Json(store + ".resumed.json");
    const int64_t from = j["config"]["resumed_step"];
    EXPECT_LT(from, 6);
    ASSERT_EQ(j["steps"].size(), size_t(6 - from)) << resumed.output;
    for (const auto& s : j["steps"]) {
      const int64_t step = s["step"];
      const double want = ref["steps"][step - 1]["loss"].get<double>();
      const double got = s["loss"].get<double>();
      EXPECT_EQ(std::memcmp(&want, &got, sizeof got), 0)
          << "step " << step << " after resuming " << from << ": " << got << " vs " << want;
      EXPECT_EQ(s["activation_bytes"]["nvme_read"].get<uint64_t>() > 0, !t.roomy_resume);
    }
    EXPECT_FALSE(std::filesystem::exists(store + kScratch))
        << "the resumed run left the scratch file behind";
    EXPECT_EQ(Contains(resumed.output, "removed the activation scratch file"), t.roomy_resume)
        << resumed.output;
  }
}

}  // namespace
