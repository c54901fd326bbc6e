// `strata train --master-dtype bf16` on the CPU model (the host device): the engine's params
// are the bf16 master, which the CPU model widens to fp32 where it uses them. With int8
// moments and an NVMe store the run trains as the fp32-state run does (losses close), a run
// killed part-way and resumed gives the uninterrupted run's losses bit for bit, and the run
// record holds the master's dtype, so --resume alone continues with it. Layer-major order
// (gradients accumulated on the device) and the recompute read the widened params as batch
// order does: the same losses.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

const std::vector<std::string> kModel = {
    "--layers",  "2",    "--d-model",    "32",   "--heads",    "2",
    "--seq-len", "16",   "--batch",      "2",    "--steps",    "30",
    "--lr",      "3e-3", "--device-mem", "128K", "--host-mem", "1M"};
const std::vector<std::string> kCompact = {"--state-dtype", "int8", "--master-dtype", "bf16"};

class TrainBf16MasterTest : public ::testing::Test {
 protected:
  // `strata train` with the model's flags, `extra`, --nvme DIR/name and --json DIR/name.json;
  // the exit code, with what it printed appended to *out.
  int Train(const std::string& name, const std::vector<std::string>& extra, std::string* out) {
    std::filesystem::create_directories(dir_ + "/" + name);
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), kModel.begin(), kModel.end());
    args.insert(args.end(), extra.begin(), extra.end());
    const std::vector<std::string> store = {"--nvme", dir_ + "/" + name, "--json", Json(name)};
    args.insert(args.end(), store.begin(), store.end());
    return Run(args, out);
  }
  int Run(const std::vector<std::string>& args, std::string* out) {
    strata::testing::CliRunOptions options;
    options.timeout_s = 300;
    const strata::testing::CliRun r =
        strata::testing::RunCli(strata::testing::ShellQuote(args), options);
    *out += r.output;
    return r.exit_code;
  }
  std::string Json(const std::string& name) const { return dir_ + "/" + name + ".json"; }
  static nlohmann::json Read(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  }
  static std::vector<double> Losses(const nlohmann::json& js) {
    std::vector<double> out;
    for (const auto& s : js["steps"]) out.push_back(s["loss"].get<double>());
    return out;
  }
  static double MeanOfLast(const std::vector<double>& v, size_t n) {
    double sum = 0;
    for (size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
    return sum / double(n);
  }
  strata::testing::TempDir tmp_{"strata-bf16-master-cli"};
  const std::string dir_ = tmp_.path();
};

TEST_F(TrainBf16MasterTest, TrainsLikeFp32StatesAndResumesBitForBit) {
  std::string out;
  ASSERT_EQ(0, Train("fp32", {}, &out)) << out;
  out.clear();
  ASSERT_EQ(0, Train("bf16", kCompact, &out)) << out;
  const nlohmann::json fp32 = Read(Json("fp32")), bf16 = Read(Json("bf16"));
  EXPECT_EQ(bf16["config"]["master_dtype"], "bf16-sr");
  EXPECT_EQ(bf16["config"]["state_dtype"], "int8");
  const std::vector<double> a = Losses(fp32), b = Losses(bf16);
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u);
  // It learns: the last five steps' mean well below the first step's loss, and within 2 % of
  // the fp32-state run's (bf16 weights and int8 moments, the same data and initial weights).
  const double fa = MeanOfLast(a, 5), fb = MeanOfLast(b, 5);
  EXPECT_LT(fb, 0.9 * b[0]) << "first " << b[0] << ", last five " << fb;
  EXPECT_NEAR(fb, fa, 0.02 * fa) << "fp32 states " << fa << ", int8 + bf16 master " << fb;
  // The first step's forward reads the initial weights rounded to bf16: close, not equal.
  EXPECT_NEAR(b[0], a[0], 0.01 * a[0]);

  // Killed at a commit part-way, resumed with --resume alone: the same losses, bit for bit.
  out.clear();
  ::setenv("STRATA_TEST_KILL_AT", "commit_begin:12", 1);
  const int killed = Train("killed", kCompact, &out);
  ::unsetenv("STRATA_TEST_KILL_AT");
  ASSERT_EQ(137, killed) << out;
  // The record holds the master's dtype; --resume without the flag continues with it.
  {
    std::ifstream f(dir_ + "/killed/strata.run.toml");
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_NE(text.str().find("master-dtype = \"bf16\""), std::string::npos) << text.str();
  }
  out.clear();
  ASSERT_EQ(0, Run({"train", "--resume", dir_ + "/killed"}, &out)) << out;
  const nlohmann::json resumed = Read(Json("killed"));
  EXPECT_EQ(resumed["config"]["master_dtype"], "bf16-sr");
  const int64_t from = resumed["config"]["resumed_step"];
  EXPECT_GE(from, 2);
  EXPECT_LT(from, 30) << "the kill came after the last step; nothing left to compare";
  ASSERT_EQ(resumed["steps"].size(), static_cast<size_t>(30 - from));
  for (const auto& s : resumed["steps"]) {
    const int64_t k = s["step"];
    EXPECT_EQ(s["loss"].get<double>(), b[static_cast<size_t>(k - 1)]) << "step " << k;
  }
}

TEST_F(TrainBf16MasterTest, LayerMajorAndRecomputeGiveTheSameLosses) {
  std::vector<std::vector<double>> losses;
  for (const std::vector<std::string>& order : {std::vector<std::string>{"batch", "--no-recompute"},
                                                {"layer", "--recompute"},
                                                {"layer", "--no-recompute"}}) {
    std::vector<std::string> args = {
        "train", "--layers", "2",           "--d-model",          "32", "--heads", "2", "--seq-len",
        "16",    "--batch",  "4",           "--micro-batches",    "2",  "--steps", "6", "--lr",
        "3e-3",  "--json",   Json("order"), "--micro-batch-order"};
    args.insert(args.end(), order.begin(), order.end());
    args.insert(args.end(), kCompact.begin(), kCompact.end());
    std::string out;
    ASSERT_EQ(0, Run(args, &out)) << out;
    losses.push_back(Losses(Read(Json("order"))));
    ASSERT_EQ(losses.back().size(), 6u) << out;
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(losses[2], losses[0]);
}

}  // namespace
