// `strata train` commands a user types in good faith that used to destroy a run (issue 45,
// round 4), end to end through the binary: a fresh run over any folder of a striped store,
// a resume that names the folders in another order or only some of them, a copied store that
// wrote the original's outputs, the refusal a fresh run gets over another run's store, a run
// that stopped after its initial commit, and the --json of a run stopped by
// --max-skipped-steps.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::Contains;
using strata::testing::RunCli;
using strata::testing::ShellQuote;

const std::vector<std::string> kModel = {
    "train", "--layers", "2", "--d-model",    "32",   "--heads",    "2", "--seq-len",
    "16",    "--batch",  "2", "--device-mem", "128K", "--host-mem", "1M"};

class TrainStoreTrustTest : public ::testing::Test {
 protected:
  strata::testing::CliRun Train(const std::vector<std::string>& extra) {
    std::vector<std::string> args = kModel;
    args.insert(args.end(), extra.begin(), extra.end());
    strata::testing::CliRunOptions o;
    o.timeout_s = 120;
    return RunCli(ShellQuote(args), o);
  }
  // Only --resume and what follows (the record gives the rest).
  strata::testing::CliRun Resume(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), extra.begin(), extra.end());
    strata::testing::CliRunOptions o;
    o.timeout_s = 120;
    return RunCli(ShellQuote(args), o);
  }
  std::string Dir(const std::string& name) {
    const std::string d = dir_ + "/" + name;
    std::filesystem::create_directories(d);
    return d;
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  // Every file of a folder with its bytes: a command that is refused changes none.
  static std::map<std::string, std::string> Snapshot(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().filename() == "strata.lock") continue;  // its pid is rewritten by the owner
      out[e.path().filename().string()] = ReadAll(e.path().string());
    }
    return out;
  }
  strata::testing::TempDir tmp_{"strata-trust"};
  const std::string dir_ = tmp_.path();
};

// Before: `--nvme B` or `--nvme B --nvme A` started afresh over B (rewriting its record and
// its part of the store) and `--resume A --nvme B --nvme A` said "start a fresh run there".
TEST_F(TrainStoreTrustTest, StripedStoreFoldersAreNeverTakenForEmptyOnes) {
  const std::string a = Dir("A"), b = Dir("B");
  const auto made = Train({"--nvme", a, "--nvme", b, "--durable", "--steps", "3"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto before_a = Snapshot(a), before_b = Snapshot(b);
  for (const std::vector<std::string>& nvme :
       {std::vector<std::string>{"--nvme", b}, {"--nvme", b, "--nvme", a}}) {
    std::vector<std::string> args = nvme;
    args.insert(args.end(), {"--steps", "3"});
    const auto r = Train(args);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "folder 1 of 2 of the swap store of run '")) << r.output;
    EXPECT_TRUE(Contains(r.output, "committed at step 3")) << r.output;
    EXPECT_TRUE(Contains(r.output, "a fresh run there would destroy it")) << r.output;
  }
  for (const std::vector<std::string>& nvme :
       {std::vector<std::string>{"--nvme", b, "--nvme", a}, {"--nvme", a}}) {
    std::vector<std::string> args = {"--resume", a};
    args.insert(args.end(), nvme.begin(), nvme.end());
    const auto r = Resume(args);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "spans 2 folder(s), given in another order or in part"))
        << r.output;
    EXPECT_TRUE(Contains(r.output, "--nvme " + a + " --nvme " + b)) << r.output;
    EXPECT_FALSE(Contains(r.output, "fresh run")) << r.output;
  }
  EXPECT_EQ(Snapshot(a), before_a);
  EXPECT_EQ(Snapshot(b), before_b);
  // The store is intact: the resume in order continues it.
  const auto resumed = Resume({"--resume", a, "--steps", "4"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// Before: "NVMe folder ... already holds a committed engine state (step N); resume it with
// --resume": now whose store it is, and its step, as a resume would say.
TEST_F(TrainStoreTrustTest, AFreshRunOverAnotherRunsStoreIsToldWhoseItIs) {
  const std::string a = Dir("A");
  ASSERT_EQ(Train({"--nvme", a, "--durable", "--steps", "2"}).exit_code, 0);
  const auto r = Train({"--nvme", a, "--steps", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "holds the swap store of another run (run '")) << r.output;
  EXPECT_TRUE(Contains(r.output, "committed at step 2")) << r.output;
}

// Before: a run killed at its initial commit (step 0) left a store that refused every fresh
// run in the folder.
TEST_F(TrainStoreTrustTest, ARunThatStoppedAtStepZeroDoesNotBlockAFreshRun) {
  const std::string a = Dir("A");
  ::setenv("STRATA_TEST_KILL_AT", "committed:1", 1);
  const auto killed = Train({"--nvme", a, "--durable", "--steps", "2"});
  ::unsetenv("STRATA_TEST_KILL_AT");
  ASSERT_EQ(killed.exit_code, 137) << killed.output;
  ASSERT_TRUE(std::filesystem::exists(a + "/strata.manifest"));
  const auto fresh = Train({"--nvme", a, "--durable", "--steps", "2"});
  EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
  const auto resumed = Resume({"--resume", a, "--steps", "3"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// Before: `cp -a o1 o2; strata train --resume o2` wrote o1's --save and --json (taken from the
// record) and said the store "moved".
TEST_F(TrainStoreTrustTest, ACopiedStoreWritesOnlyInsideItselfAndSaysItIsACopy) {
  const std::string o1 = Dir("o1"), out = Dir("out");
  const std::string save = o1 + "/w.safetensors", json = out + "/run.json";
  ASSERT_EQ(
      Train({"--nvme", o1, "--durable", "--steps", "2", "--save", save, "--json", json}).exit_code,
      0);
  const std::string saved = ReadAll(save), written = ReadAll(json);
  const std::string o2 = dir_ + "/o2";
  ASSERT_EQ(0, std::system(("cp -a " + o1 + " " + o2).c_str()));
  const auto copy = Resume({"--resume", o2, "--steps", "4"});
  ASSERT_EQ(copy.exit_code, 0) << copy.output;
  EXPECT_TRUE(Contains(copy.output, "a copy of the store in " + o1)) << copy.output;
  EXPECT_FALSE(Contains(copy.output, "moved here")) << copy.output;
  EXPECT_EQ(ReadAll(save), saved) << "the copy rewrote the original's --save";
  EXPECT_EQ(ReadAll(json), written) << "the copy rewrote the original's --json";
  EXPECT_TRUE(std::filesystem::exists(o2 + "/w.safetensors")) << copy.output;
  EXPECT_TRUE(Contains(copy.output, "--json " + json + " (from the record) is not written"))
      << copy.output;
  // Given on the command line, an output goes where it says.
  const std::string mine = out + "/copy.json";
  const auto given = Resume({"--resume", o2, "--steps", "5", "--json", mine});
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_TRUE(std::filesystem::exists(mine));
  EXPECT_EQ(ReadAll(json), written);
  // A move leaves nothing behind, and says so.
  const std::string o3 = dir_ + "/o3";
  std::filesystem::rename(o1, o3);
  const auto moved = Resume({"--resume", o3, "--steps", "3"});
  ASSERT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_TRUE(Contains(moved.output, "the store moved here from " + o1)) << moved.output;
  EXPECT_FALSE(std::filesystem::exists(o1));
  EXPECT_TRUE(std::filesystem::exists(o3 + "/w.safetensors"));
}

// Before: the --json of a run stopped by --max-skipped-steps left out the step that stopped it.
TEST_F(TrainStoreTrustTest, MaxSkippedStepsJsonHoldsTheStepThatStoppedTheRun) {
  const std::string a = Dir("A"), json = dir_ + "/r.json";
  const auto r = Train({"--nvme", a, "--durable", "--lr", "1e4", "--grad-clip", "1", "--steps",
                        "40", "--max-skipped-steps", "2", "--json", json});
  ASSERT_EQ(r.exit_code, 1) << r.output;
  const std::string key = "stopping at step ";
  const size_t at = r.output.find(key);
  ASSERT_NE(at, std::string::npos) << r.output;
  const int64_t stopped = std::stoll(r.output.substr(at + key.size()));
  const nlohmann::json js = nlohmann::json::parse(ReadAll(json));
  ASSERT_FALSE(js["steps"].empty()) << js.dump();
  EXPECT_EQ(js["steps"].back()["step"].get<int64_t>(), stopped) << js.dump();
  EXPECT_TRUE(js["steps"].back()["skipped"].get<bool>()) << js.dump();
  EXPECT_GE(js["totals"]["skipped_steps"].get<int64_t>(), 2) << js.dump();
}

}  // namespace
