// The fault matrix: a short `strata train` with its states on NVMe (--durable), run once
// per fault at one point of the run (the N-th request of a kind, or a SIGKILL at the N-th
// time the store reaches a commit point), through the real binary with the faults injected
// from the environment (engine/fault_env.h). Each run must end with one clear error naming
// the fault (or, for a fault a correct store hides, succeed with the fault-free losses),
// never a crash; and `--resume` must then reproduce the fault-free run's losses bit for bit
// from the last commit. The one exception is a corrupted extent written to the disk (not
// just read back wrong): the store keeps one committed version, so that damage cannot be
// repaired, and the rule is then a clear Corruption error naming the extent, at the run or
// at the resume.
#include <gtest/gtest.h>
#include <stdlib.h>

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

// 4 engine blocks (2 layers), every optimizer state homed on NVMe (--host-mem below the
// states), committed every step.
const std::vector<std::string> kRun = {
    "train", "--layers",  "2",  "--d-model",  "64",    "--heads",
    "2",     "--seq-len", "32", "--batch",    "4",     "--lr",
    "1e-3",  "--steps",   "8",  "--host-mem", "1200K", "--durable"};

enum class Outcome {
  kError,      // rc 1, one line naming the fault (`expect` in it)
  kInvisible,  // rc 0, the fault-free losses
  kKilled,     // SIGKILL (rc 137)
  kDamaged,    // rc 1 with Corruption, at the run or at its resume
  // A bit flipped on its way back from the disk: Corruption (the checksum), or nothing when
  // the bit fell in the padding of the extent's last 4 KiB block (not part of the data).
  kCaughtOrHarmless,
  // The first commit failed: nothing to resume. The resume says so and that a fresh run
  // works; the same command (no --resume) in the same folder gives the fault-free losses.
  kBeforeFirstCommit,
  // SIGKILL right after the initial commit (step 0: the weights, nothing trained): a fresh
  // run in the same folder takes the store and gives the fault-free losses (round 4; before,
  // it was refused as "already holds a committed engine state (step 0)").
  kKilledAtInitialCommit,
};

struct Case {
  std::string variable;  // STRATA_TEST_FAULT or STRATA_TEST_KILL_AT
  std::string value;
  Outcome outcome;
  std::string expect;  // for kError and kDamaged: a word of the message
};

std::vector<double> Losses(const std::string& json) {
  std::vector<double> out;
  std::ifstream f(json);
  if (!f) return out;
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& s : j["steps"]) out.push_back(s["loss"].get<double>());
  return out;
}

strata::testing::CliRun Train(const std::vector<std::string>& extra, const Case* fault) {
  std::vector<std::string> args = kRun;
  args.insert(args.end(), extra.begin(), extra.end());
  if (fault != nullptr) ::setenv(fault->variable.c_str(), fault->value.c_str(), 1);
  strata::testing::CliRunOptions o;
  o.timeout_s = 120;
  auto r = RunCli(ShellQuote(args), o);
  if (fault != nullptr) ::unsetenv(fault->variable.c_str());
  return r;
}

// Output that only a crash prints.
bool LooksLikeACrash(const strata::testing::CliRun& r) {
  return r.exit_code > 128 || Contains(r.output, "terminate called") ||
         Contains(r.output, "Segmentation") || Contains(r.output, "Sanitizer") ||
         Contains(r.output, "Assertion");
}

// The matrix: each injected fault or kill, and what the run must do.
std::vector<Case> FaultCases() {
  // N for requests: initialising the weights takes the first ~50 reads and writes; each
  // step then about 30 of each, so these land in steps 1 to 5.
  return {
      {"STRATA_TEST_FAULT", "eio_read@60", Outcome::kError, "IOError"},
      {"STRATA_TEST_FAULT", "eio_read@120", Outcome::kError, "IOError"},
      {"STRATA_TEST_FAULT", "eio_write@60", Outcome::kError, "IOError"},
      {"STRATA_TEST_FAULT", "eio_write@120", Outcome::kError, "IOError"},
      {"STRATA_TEST_FAULT", "enospc_write@75", Outcome::kError, "NoSpace"},
      {"STRATA_TEST_FAULT", "enospc_write@140", Outcome::kError, "NoSpace"},
      {"STRATA_TEST_FAULT", "short_write@58", Outcome::kInvisible, ""},
      {"STRATA_TEST_FAULT", "short_write@130", Outcome::kInvisible, ""},
      {"STRATA_TEST_FAULT", "flip_read@70", Outcome::kCaughtOrHarmless, "Corruption"},
      {"STRATA_TEST_FAULT", "flip_read@150", Outcome::kCaughtOrHarmless, "Corruption"},
      // (Not @100: with the updates pipelined, that write is superseded before any read.)
      {"STRATA_TEST_FAULT", "flip_write@102", Outcome::kDamaged, "Corruption"},
      {"STRATA_TEST_FAULT", "sync_eio@1", Outcome::kBeforeFirstCommit, "fdatasync"},
      {"STRATA_TEST_FAULT", "sync_eio@2", Outcome::kError, "fdatasync"},
      {"STRATA_TEST_FAULT", "sync_eio@6", Outcome::kError, "fdatasync"},
      {"STRATA_TEST_KILL_AT", "write_submitted:40", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "commit_begin:3", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "data_synced:4", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "manifest_temp_written:5", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "manifest_renamed:6", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "committed:7", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "committed:1", Outcome::kKilledAtInitialCommit, ""},
      // The pipelined step boundary (--pipeline on, the default, with --grad-clip 1: every
      // step defers its updates): step k's updates and their writes run under step k+1's
      // forward, and its commit lands during it. A kill while a carried update's write is in
      // flight, and at each point of a commit that overlaps the next forward.
      {"STRATA_TEST_KILL_AT", "write_submitted:32", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "write_submitted:36", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "commit_begin:5", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "data_synced:6", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "manifest_renamed:4", Outcome::kKilled, ""},
  };
}

TEST(TrainFaultMatrixTest, EveryFaultIsAClearErrorAndResumeReproducesTheLosses) {
  strata::testing::TempDir tmp("strata-fm");
  const std::string dir = tmp.path();
  std::filesystem::create_directory(dir + "/ref");
  const auto ref_run = Train({"--nvme", dir + "/ref", "--json", dir + "/ref.json"}, nullptr);
  ASSERT_EQ(ref_run.exit_code, 0) << ref_run.output;
  const std::vector<double> ref = Losses(dir + "/ref.json");
  ASSERT_EQ(ref.size(), 8u);
  // The reference deferred its updates to the next step's forward (--pipeline on, the
  // default); the same run with the updates at the end of each step gives the same losses.
  EXPECT_TRUE(Contains(ref_run.output, "run under the next step's forward")) << ref_run.output;
  std::filesystem::create_directory(dir + "/ref_off");
  const auto off_run = Train(
      {"--nvme", dir + "/ref_off", "--json", dir + "/ref_off.json", "--pipeline", "off"}, nullptr);
  ASSERT_EQ(off_run.exit_code, 0) << off_run.output;
  EXPECT_EQ(Losses(dir + "/ref_off.json"), ref);

  const std::vector<Case> cases = FaultCases();
  int k = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variable + "=" + c.value);
    const std::string store = dir + "/c" + std::to_string(k++);
    std::filesystem::create_directory(store);
    const auto r = Train({"--nvme", store, "--json", store + ".json"}, &c);
    if (c.outcome != Outcome::kKilled && c.outcome != Outcome::kKilledAtInitialCommit) {
      EXPECT_FALSE(LooksLikeACrash(r)) << r.output;
    }
    Outcome outcome = c.outcome;
    if (outcome == Outcome::kCaughtOrHarmless) {
      outcome = r.exit_code == 0 ? Outcome::kInvisible : Outcome::kError;
    }
    switch (outcome) {
      case Outcome::kCaughtOrHarmless:
      case Outcome::kError:
      case Outcome::kDamaged:
        EXPECT_EQ(r.exit_code, 1) << r.output;
        break;
      case Outcome::kBeforeFirstCommit: {
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_TRUE(Contains(r.output, c.expect)) << r.output;
        const auto resumed = Train({"--resume", store}, nullptr);
        EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
        EXPECT_TRUE(Contains(resumed.output, "before its first commit")) << resumed.output;
        EXPECT_TRUE(Contains(resumed.output, "without --resume")) << resumed.output;
        const auto fresh = Train({"--nvme", store, "--json", store + ".json"}, nullptr);
        EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
        EXPECT_EQ(Losses(store + ".json"), ref);
        continue;
      }
      case Outcome::kKilledAtInitialCommit: {
        EXPECT_EQ(r.exit_code, 137) << r.output;
        const auto fresh = Train({"--nvme", store, "--json", store + ".json"}, nullptr);
        EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
        EXPECT_EQ(Losses(store + ".json"), ref);
        continue;
      }
      case Outcome::kInvisible:
        EXPECT_EQ(r.exit_code, 0) << r.output;
        EXPECT_EQ(Losses(store + ".json"), ref);
        continue;
      case Outcome::kKilled:
        EXPECT_EQ(r.exit_code, 137) << r.output;
        break;
    }
    if (outcome == Outcome::kError) {
      EXPECT_TRUE(Contains(r.output, "strata train: ")) << r.output;
      EXPECT_TRUE(Contains(r.output, c.expect)) << r.output;
      // Silent corruption is named by the checksum, the others by the injected errno.
      if (c.expect != "Corruption") {
        EXPECT_TRUE(Contains(r.output, "injected fault")) << r.output;
      }
    }
    // Resume from the last commit, without the fault.
    const auto resumed =
        Train({"--nvme", store, "--resume", store, "--json", store + ".resumed.json"}, nullptr);
    EXPECT_FALSE(LooksLikeACrash(resumed)) << resumed.output;
    if (c.outcome == Outcome::kDamaged && resumed.exit_code != 0) {
      EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
      EXPECT_TRUE(Contains(r.output + resumed.output, c.expect)) << r.output << resumed.output;
      continue;
    }
    ASSERT_EQ(resumed.exit_code, 0) << r.output << "\n--- resume:\n" << resumed.output;
    std::ifstream f(store + ".resumed.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    const int64_t from = j["config"]["resumed_step"];
    if (c.outcome == Outcome::kDamaged) {
      // The damaged extent was superseded before anything read it: the run went on.
      EXPECT_TRUE(Contains(r.output, c.expect)) << r.output;
    }
    for (const auto& s : j["steps"]) {
      const int64_t step = s["step"];
      EXPECT_EQ(s["loss"].get<double>(), ref[step - 1])
          << "step " << step << " after resuming " << from;
    }
  }
}

// Int8 moments (--state-dtype int8: codes and scales in one extent per moment) resume after a
// SIGKILL at each kind of commit point with the uninterrupted int8 run's losses, bit for bit,
// like the other dtypes above; and they train: the losses are not fp32's, but near them.
TEST(TrainFaultMatrixTest, Int8MomentsResumeAfterSigkillBitForBit) {
  strata::testing::TempDir tmp("strata-fm8");
  const std::string dir = tmp.path();
  std::filesystem::create_directory(dir + "/ref");
  const std::vector<std::string> int8 = {"--state-dtype", "int8"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), int8.begin(), int8.end());
    return a;
  };
  const auto ref_run = Train(with({"--nvme", dir + "/ref", "--json", dir + "/ref.json"}), nullptr);
  ASSERT_EQ(ref_run.exit_code, 0) << ref_run.output;
  const std::vector<double> ref = Losses(dir + "/ref.json");
  ASSERT_EQ(ref.size(), 8u);
  std::filesystem::create_directory(dir + "/f32");
  ASSERT_EQ(Train({"--nvme", dir + "/f32", "--json", dir + "/f32.json"}, nullptr).exit_code, 0);
  const std::vector<double> f32 = Losses(dir + "/f32.json");
  ASSERT_EQ(f32.size(), 8u);
  EXPECT_NE(ref, f32);
  EXPECT_NEAR(ref.back(), f32.back(), 0.05 * f32.back());
  const std::vector<Case> kills = {
      {"STRATA_TEST_KILL_AT", "write_submitted:40", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "data_synced:4", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "manifest_temp_written:5", Outcome::kKilled, ""},
      {"STRATA_TEST_KILL_AT", "manifest_renamed:6", Outcome::kKilled, ""},
  };
  int k = 0;
  for (const Case& c : kills) {
    SCOPED_TRACE(c.value);
    const std::string store = dir + "/c" + std::to_string(k++);
    std::filesystem::create_directory(store);
    const auto r = Train(with({"--nvme", store}), &c);
    EXPECT_EQ(r.exit_code, 137) << r.output;
    const auto resumed = Train(
        with({"--nvme", store, "--resume", store, "--json", store + ".resumed.json"}), nullptr);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    std::ifstream f(store + ".resumed.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_FALSE(j["steps"].empty());
    for (const auto& s : j["steps"]) {
      const int64_t step = s["step"];
      EXPECT_EQ(s["loss"].get<double>(), ref[step - 1]) << "step " << step;
    }
  }
}

}  // namespace
