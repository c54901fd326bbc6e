// `strata train` across ranks on the CPU over Gloo (real processes, real TCP on loopback):
// 2 and 4 ranks give the single-rank run's per-step losses (within 1e-5 relative) with and
// without clipping; two runs with the same world size are bit-identical; a rank killed
// mid-run makes the others fail, naming it, within --comm-timeout; --resume with the same
// world size reproduces the uninterrupted losses; a batch that does not split is refused;
// --grad-dtype bf16 trains on 2 ranks (half the D2H bytes, as predicted);
// `strata bench step` across 2 ranks reports the collectives on their own lane.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"
#include "tests/trainer/rank_spawn.h"

namespace {

using namespace std::chrono_literals;

// A tiny model so that 20 steps over 4 ranks take a second or two on 2 cores.
const std::vector<std::string> kModel = {"--layers", "2",         "--d-model", "32",      "--heads",
                                         "2",        "--seq-len", "16",        "--batch", "4",
                                         "--steps",  "20",        "--lr",      "3e-3"};

using strata::testing::ReadFile;
using strata::testing::ShellQuote;
using strata::testing::SpawnRank;

class TrainMultirankTest : public ::testing::Test {
 protected:
  // Runs `strata <args>` (shell text); returns its exit code, stdout+stderr appended to *out.
  int Strata(const std::string& args, std::string* out) {
    strata::testing::CliRunOptions options;
    options.timeout_s = 300;
    const strata::testing::CliRun r = strata::testing::RunCli(args, options);
    *out += r.output;
    return r.exit_code;
  }
  // `strata train` with `ranks` ranks (1: plain) and the extra flags; the per-step losses.
  std::vector<double> Train(int ranks, const std::vector<std::string>& extra,
                            const std::string& json) {
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), kModel.begin(), kModel.end());
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--json");
    args.push_back(json);
    std::string launch;
    if (ranks > 1) launch = "launch -n " + std::to_string(ranks) + " -- " + STRATA_CLI_PATH;
    std::string out;
    const int rc = Strata(launch + ShellQuote(args), &out);
    EXPECT_EQ(rc, 0) << out;
    std::vector<double> losses;
    std::ifstream f(json);
    if (!f) {
      ADD_FAILURE() << "no " << json << "\n" << out;
      return losses;
    }
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j["config"]["world_size"], ranks);
    for (const auto& s : j["steps"]) losses.push_back(s["loss"].get<double>());
    return losses;
  }
  strata::testing::TempDir tmp_{"strata-mr"};
  const std::string dir_ = tmp_.path();
};

void ExpectClose(const std::vector<double>& ref, const std::vector<double>& got, double rtol,
                 const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - ref[i]), rtol * std::fabs(ref[i]))
        << what << ": step " << i + 1 << " loss " << got[i] << " vs single-rank " << ref[i];
  }
}

TEST_F(TrainMultirankTest, LossesMatchOneRankWithAndWithoutClipping) {
  for (const char* clip : {"0", "0.5"}) {
    const std::vector<std::string> flags = {"--grad-clip", clip};
    const std::vector<double> one = Train(1, flags, dir_ + "/one.json");
    ASSERT_EQ(one.size(), 20u);
    if (std::string(clip) != "0") {
      // The clipping must actually engage, or this case tests nothing new.
      std::ifstream f(dir_ + "/one.json");
      const nlohmann::json j = nlohmann::json::parse(f);
      int clipped = 0;
      for (const auto& s : j["steps"]) clipped += s["grad_norm"].get<double>() > 0.5 ? 1 : 0;
      EXPECT_GT(clipped, 5);
    }
    for (int ranks : {2, 4}) {
      const std::string tag = std::to_string(ranks) + " ranks, --grad-clip " + clip;
      const std::vector<double> got =
          Train(ranks, flags, dir_ + "/r" + std::to_string(ranks) + ".json");
      ExpectClose(one, got, 1e-5, tag);
    }
  }
}

TEST_F(TrainMultirankTest, SameWorldSizeIsBitIdenticalWithSharding) {
  // Per-rank NVMe folders and small host budgets, so the sharded states really spill.
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    const std::string nvme = dir_ + "/run" + std::to_string(run) + "/{rank}";
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(0, std::system(
                       ("mkdir -p " + dir_ + "/run" + std::to_string(run) + "/" + std::to_string(r))
                           .c_str()));
    }
    runs.push_back(Train(2, {"--nvme", nvme, "--host-mem", "600K", "--device-mem", "256K"},
                         dir_ + "/bits" + std::to_string(run) + ".json"));
  }
  ASSERT_EQ(runs[0].size(), 20u);
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i], runs[1][i]) << "step " << i + 1;
  }
}

// Layer-major across ranks averages each micro-batch's gradient over the ranks as
// batch-major does, so the two orders give the same bits: every step's loss and gradient
// norm, and the saved weights, with and without --recompute, states spilled to NVMe.
// Offloaded activations on two ranks (each rank's micro-batches share one activation slot,
// their block inputs in its own engine, spilled to NVMe at a small host budget): the same
// losses, norms and weights as batch-major.
TEST_F(TrainMultirankTest, OffloadedActivationsAcrossTwoRanksMatchBatchMajor) {
  std::vector<std::string> saved;
  std::vector<nlohmann::json> runs;
  for (const char* tag : {"batch", "offload"}) {
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + "/" + tag + "/" + std::to_string(r)).c_str()));
    }
    std::vector<std::string> flags = {
        "--micro-batches", "3",    "--recompute",  "--grad-clip", "0.5",
        "--host-mem",      "700K", "--device-mem", "2M"};
    if (std::string(tag) == "batch") {
      flags.insert(flags.end(), {"--micro-batch-order", "batch"});
    } else {
      flags.insert(flags.end(), {"--micro-batch-order", "layer", "--offload-activations", "on"});
    }
    flags.insert(flags.end(), {std::string("--nvme"), dir_ + "/" + tag + "/{rank}",
                               std::string("--save"), dir_ + "/" + tag + ".safetensors"});
    const std::string json = dir_ + "/" + tag + ".json";
    ASSERT_EQ(Train(2, flags, json).size(), 20u) << tag;
    std::ifstream f(json);
    runs.push_back(nlohmann::json::parse(f));
    std::ifstream w(dir_ + "/" + tag + ".safetensors", std::ios::binary);
    saved.emplace_back(std::istreambuf_iterator<char>(w), std::istreambuf_iterator<char>());
  }
  EXPECT_GT(runs[1]["config"]["activation_slots"].get<int>(), 0)
      << runs[1]["config"]["micro_batch_order_reason"];
  EXPECT_GT(runs[1]["steps"][5]["activation_bytes"]["d2h"].get<uint64_t>(), 0u);
  for (size_t i = 0; i < 20; ++i) {
    for (const char* key : {"loss", "grad_norm"}) {
      const double a = runs[0]["steps"][i][key].get<double>();
      const double b = runs[1]["steps"][i][key].get<double>();
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
          << key << " of step " << i + 1 << ": " << a << " vs " << b;
    }
  }
  ASSERT_FALSE(saved[0].empty());
  EXPECT_TRUE(saved[0] == saved[1]) << "the saved weights differ";
}

TEST_F(TrainMultirankTest, LayerMajorIsBitIdenticalToBatchMajorAcrossTwoRanks) {
  for (const bool recompute : {false, true}) {
    std::vector<std::string> saved;
    std::vector<nlohmann::json> runs;
    for (const char* order : {"batch", "layer"}) {
      const std::string tag = std::string(order) + (recompute ? "-rc" : "");
      for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(0,
                  std::system(("mkdir -p " + dir_ + "/" + tag + "/" + std::to_string(r)).c_str()));
      }
      // kModel's 20 steps; a small host budget spills the sharded states to NVMe.
      std::vector<std::string> flags = {"--micro-batches", "3",   "--micro-batch-order", order,
                                        "--grad-clip",     "0.5", "--host-mem",          "600K",
                                        "--device-mem",    "2M"};
      flags.insert(flags.end(), {std::string("--nvme"), dir_ + "/" + tag + "/{rank}",
                                 std::string("--save"), dir_ + "/" + tag + ".safetensors"});
      if (recompute) flags.push_back("--recompute");
      const std::string json = dir_ + "/" + tag + ".json";
      ASSERT_EQ(Train(2, flags, json).size(), 20u) << tag;
      std::ifstream f(json);
      runs.push_back(nlohmann::json::parse(f));
      EXPECT_EQ(runs.back()["config"]["micro_batch_order"], order) << tag;
      EXPECT_EQ(runs.back()["config"]["layer_major_activation_bytes"].get<uint64_t>() > 0,
                std::string(order) == "layer")
          << runs.back()["config"]["micro_batch_order_reason"];
      std::ifstream w(dir_ + "/" + tag + ".safetensors", std::ios::binary);
      saved.emplace_back(std::istreambuf_iterator<char>(w), std::istreambuf_iterator<char>());
    }
    for (size_t i = 0; i < 20; ++i) {
      for (const char* key : {"loss", "grad_norm"}) {
        const double a = runs[0]["steps"][i][key].get<double>();
        const double b = runs[1]["steps"][i][key].get<double>();
        EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
            << key << " of step " << i + 1 << (recompute ? " (--recompute)" : "") << ": " << a
            << " vs " << b;
      }
    }
    ASSERT_FALSE(saved[0].empty());
    EXPECT_TRUE(saved[0] == saved[1])
        << "the saved weights differ" << (recompute ? " (--recompute)" : "");
  }
}

// --micro-batch-order auto without --recompute weighs the recompute layer-major may need by a
// GEMM timing, which differs from rank to rank: rank 0 times and shares it (a broadcast every
// rank must join, so a rank that skipped or added one would hang or fail this run), and the
// order chosen trains batch-major's losses. Which order the shared figure picks is
// MicroBatchOrderTest.AutoWeighsTheRecomputeAgainstBatchMajorsTraffic's to check: two ranks on
// one host time alike, so this run cannot tell a shared figure from two similar ones.
TEST_F(TrainMultirankTest, AutoOrderWeighedOnRankZeroIsEveryRanks) {
  const std::vector<std::string> tight = {"--micro-batches", "3", "--device-mem", "2M"};
  std::vector<std::string> batch_flags = tight;
  batch_flags.insert(batch_flags.end(), {"--micro-batch-order", "batch"});
  const std::vector<double> batch = Train(2, batch_flags, dir_ + "/batch.json");
  const std::vector<double> chosen = Train(2, tight, dir_ + "/auto.json");
  ASSERT_EQ(batch.size(), 20u);
  EXPECT_EQ(batch, chosen);
  std::ifstream f(dir_ + "/auto.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_FALSE(j["config"]["micro_batch_order_reason"].get<std::string>().empty());
}

// --grad-dtype bf16 on 2 ranks: each rank's whole block crosses D2H as bf16 (the gradients
// reduce in host memory): exactly the placement's prediction, half the fp32 run's; the losses
// within 0.1% of the fp32 2-rank run's (the gradients are rounded to bf16; not equal: the
// rounding ran); two runs bit-identical; the run record keeps it: a resume that changes it is
// refused, a plain resume continues with bf16; --collective-memory device is refused.
TEST_F(TrainMultirankTest, Bf16GradientsAcrossTwoRanks) {
  const std::vector<double> fp32 = Train(2, {"--collective-memory", "host"}, dir_ + "/f.json");
  std::vector<std::vector<double>> bf16;
  for (const char* run : {"a", "b"}) {
    bf16.push_back(Train(2, {"--grad-dtype", "bf16", "--nvme", dir_ + "/" + run + "/{rank}"},
                         dir_ + "/" + run + ".json"));
  }
  ASSERT_EQ(fp32.size(), 20u);
  ASSERT_EQ(bf16[0].size(), 20u);
  EXPECT_EQ(bf16[0], bf16[1]) << "two runs with bf16 gradients differ";
  std::ifstream ff(dir_ + "/f.json"), gf(dir_ + "/a.json");
  const nlohmann::json f = nlohmann::json::parse(ff), g = nlohmann::json::parse(gf);
  EXPECT_EQ(g["config"]["grad_dtype"], "bf16");
  EXPECT_EQ(g["config"]["collective_memory"], "host");
  const uint64_t predicted = g["placement"]["predicted_bytes"]["d2h"].get<uint64_t>();
  EXPECT_GT(predicted, 0u);
  double max_rel = 0;
  for (size_t i = 0; i < 20; ++i) {
    const uint64_t d2h = g["steps"][i]["bytes"]["d2h"].get<uint64_t>();
    EXPECT_EQ(d2h, predicted) << "step " << i + 1;
    EXPECT_EQ(d2h * 2, f["steps"][i]["bytes"]["d2h"].get<uint64_t>()) << "step " << i + 1;
    max_rel = std::max(max_rel, std::fabs(bf16[0][i] - fp32[i]) / fp32[i]);
  }
  std::printf("[grad-dtype] 2 ranks: max relative loss difference bf16 vs fp32, 20 steps: %.3g\n",
              max_rel);
  EXPECT_GT(max_rel, 0.0);
  EXPECT_LT(max_rel, 1e-3);

  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kModel.begin(), kModel.end());
  *(std::find(args.begin(), args.end(), "--steps") + 1) = "24";
  args.insert(args.end(), {"--nvme", dir_ + "/a/{rank}", "--resume", dir_ + "/a/{rank}"});
  std::vector<std::string> changed = args;
  changed.insert(changed.end(), {"--grad-dtype", "fp32"});
  const std::string launch = std::string("launch -n 2 -- ") + STRATA_CLI_PATH;
  std::string out;
  EXPECT_NE(0, Strata(launch + ShellQuote(changed), &out)) << out;
  EXPECT_NE(out.find("--grad-dtype: \"bf16\" -> \"fp32\""), std::string::npos) << out;
  // Collectives in device memory would sum bf16: refused, naming the ways out.
  std::vector<std::string> device = {"train"};
  device.insert(device.end(), kModel.begin(), kModel.end());
  device.insert(device.end(), {"--grad-dtype", "bf16", "--collective-memory", "device"});
  out.clear();
  EXPECT_NE(0, Strata(launch + ShellQuote(device), &out)) << out;
  EXPECT_NE(out.find("use collective memory 'host' (or auto) or grad_dtype fp32"),
            std::string::npos)
      << out;
  args.insert(args.end(), {"--json", dir_ + "/resumed.json"});
  out.clear();
  ASSERT_EQ(0, Strata(launch + ShellQuote(args), &out)) << out;
  std::ifstream rf(dir_ + "/resumed.json");
  const nlohmann::json r = nlohmann::json::parse(rf);
  EXPECT_EQ(r["config"]["grad_dtype"], "bf16");
  EXPECT_EQ(r["config"]["resumed_step"], 20);
  ASSERT_EQ(r["steps"].size(), 4u);
  for (const auto& s : r["steps"]) EXPECT_EQ(s["bytes"]["d2h"].get<uint64_t>(), predicted);
}

// With ranks each micro-batch's gradient lands on its own (the model does not sum them on
// the device), so layer-major order works with bf16 gradients and gives batch-major's bits.
TEST_F(TrainMultirankTest, Bf16GradientsLayerMajorMatchesBatchMajorAcrossTwoRanks) {
  std::vector<nlohmann::json> runs;
  for (const char* order : {"batch", "layer"}) {
    const std::string json = dir_ + "/" + order + ".json";
    ASSERT_EQ(Train(2,
                    {"--grad-dtype", "bf16", "--micro-batches", "2", "--micro-batch-order", order,
                     "--grad-clip", "0.5"},
                    json)
                  .size(),
              20u);
    std::ifstream f(json);
    runs.push_back(nlohmann::json::parse(f));
    EXPECT_EQ(runs.back()["config"]["micro_batch_order"], order)
        << runs.back()["config"]["micro_batch_order_reason"];
  }
  for (size_t i = 0; i < 20; ++i) {
    for (const char* key : {"loss", "grad_norm"}) {
      const double a = runs[0]["steps"][i][key].get<double>();
      const double b = runs[1]["steps"][i][key].get<double>();
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
          << key << " of step " << i + 1 << ": " << a << " vs " << b;
    }
  }
}

// Rank 0 alone reads --init (the others receive the configuration and the weights).
TEST_F(TrainMultirankTest, InitFromRankZeroMatchesOneRank) {
  std::string out;
  const std::vector<std::string> save = {
      "train",   "--layers", "2",         "--d-model", "32",
      "--heads", "2",        "--seq-len", "16",        "--batch",
      "4",       "--steps",  "3",         "--save",    dir_ + "/m.safetensors"};
  ASSERT_EQ(0, Strata(ShellQuote(save), &out)) << out;
  // The configuration comes from the file (read on rank 0 only; --layers/--d-model of
  // kModel are ignored with --init).
  const std::vector<std::string> flags = {"--init", dir_ + "/m.safetensors"};
  const std::vector<double> one = Train(1, flags, dir_ + "/i1.json");
  ASSERT_EQ(one.size(), 20u);
  ExpectClose(one, Train(2, flags, dir_ + "/i2.json"), 1e-5, "2 ranks with --init");
}

TEST_F(TrainMultirankTest, BatchThatDoesNotSplitIsRefused) {
  std::string out;
  const int rc = Strata(std::string("launch -n 3 -- ") + STRATA_CLI_PATH +
                            ShellQuote({"train", "--layers", "1", "--d-model", "32", "--heads", "2",
                                        "--seq-len", "16", "--batch", "4", "--steps", "1"}),
                        &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--batch 4 does not split over 3 ranks"), std::string::npos) << out;
}

TEST_F(TrainMultirankTest, KilledRankIsNamedAndResumeReproducesTheLosses) {
  for (const char* d : {"/full/0", "/full/1", "/b/0", "/b/1", "/rdv1", "/rdv2"}) {
    ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + d).c_str()));
  }
  const std::vector<std::string> budgets = {"--host-mem", "600K",           "--device-mem",
                                            "256K",       "--comm-timeout", "5"};
  std::vector<std::string> full_flags = budgets;
  full_flags.insert(full_flags.end(), {"--nvme", dir_ + "/full/{rank}"});
  const std::vector<double> full = Train(2, full_flags, dir_ + "/full.json");
  ASSERT_EQ(full.size(), 20u);

  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kModel.begin(), kModel.end());
  args.insert(args.end(), budgets.begin(), budgets.end());
  args.insert(args.end(), {"--nvme", dir_ + "/b/{rank}"});
  int fd0 = -1, fd1 = -1;
  const pid_t r0 = SpawnRank(0, 2, dir_ + "/rdv1", args, &fd0, dir_ + "/err0");
  const pid_t r1 = SpawnRank(1, 2, dir_ + "/rdv1", args, &fd1, dir_ + "/err1");
  // Rank 0 reports progress; kill rank 1 once step 5 is printed (mid-run).
  std::string seen;
  char buf[512];
  ssize_t n;
  while (seen.find("step     5/20") == std::string::npos && (n = read(fd0, buf, sizeof buf)) > 0) {
    seen.append(buf, n);
  }
  ASSERT_NE(seen.find("step     5/20"), std::string::npos) << seen << ReadFile(dir_ + "/err0");
  ASSERT_EQ(0, kill(r1, SIGKILL));
  const auto killed_at = std::chrono::steady_clock::now();
  waitpid(r1, nullptr, 0);
  // Rank 0 must stop by itself within the timeout (5 s) plus slack; never hang.
  int st = 0;
  bool exited = false;
  while (std::chrono::steady_clock::now() - killed_at < 60s) {
    if (waitpid(r0, &st, WNOHANG) == r0) {
      exited = true;
      break;
    }
    while ((n = read(fd0, buf, sizeof buf)) > 0) seen.append(buf, n);  // keep the pipe drained
    std::this_thread::sleep_for(20ms);
  }
  if (!exited) {
    kill(r0, SIGKILL);
    waitpid(r0, nullptr, 0);
  }
  close(fd0);
  close(fd1);
  ASSERT_TRUE(exited) << "rank 0 hung after rank 1 died";
  const std::string err = ReadFile(dir_ + "/err0");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << err;
  EXPECT_NE(err.find("rank 1"), std::string::npos) << "the error does not name the lost rank:\n"
                                                   << err;

  // Resume both ranks from their own stores.
  std::vector<std::string> resume = budgets;
  resume.insert(resume.end(), {"--nvme", dir_ + "/b/{rank}", "--resume", dir_ + "/b/{rank}"});
  std::vector<std::string> rargs = {"train"};
  rargs.insert(rargs.end(), kModel.begin(), kModel.end());
  rargs.insert(rargs.end(), resume.begin(), resume.end());
  rargs.insert(rargs.end(), {"--json", dir_ + "/resumed.json"});
  std::string out;
  ASSERT_EQ(0, Strata(std::string("launch -n 2 -- ") + STRATA_CLI_PATH + ShellQuote(rargs), &out))
      << out;
  std::ifstream f(dir_ + "/resumed.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  const int64_t from = j["config"]["resumed_step"];
  // Step 5 was printed: step 4 at least is committed (with pipelined updates, the ranks commit
  // a step at the end of the next one).
  EXPECT_GE(from, 4);
  EXPECT_LT(from, 20) << "the kill came after the last step; nothing left to compare";
  ASSERT_EQ(j["steps"].size(), static_cast<size_t>(20 - from));
  for (const auto& s : j["steps"]) {
    const int64_t k = s["step"];
    EXPECT_EQ(s["loss"].get<double>(), full[k - 1]) << "step " << k;
  }
}

// Each rank's store records the world size; rank 0's folder resumed on one rank re-shards
// (the record names every rank's folders), and a change of the model is still refused.
TEST_F(TrainMultirankTest, ResumeWithAnotherWorldSizeReshards) {
  for (const char* d : {"/s/0", "/s/1"}) {
    ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + d).c_str()));
  }
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kModel.begin(), kModel.end());
  args.insert(args.end(), {"--nvme", dir_ + "/s/{rank}"});
  std::string out;
  ASSERT_EQ(0, Strata(std::string("launch -n 2 -- ") + STRATA_CLI_PATH + ShellQuote(args), &out))
      << out;
  strata::testing::CliRunOptions options;
  options.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  strata::testing::CliRun r = strata::testing::RunCli(
      ShellQuote({"train", "--resume", dir_ + "/s/0", "--steps", "30", "--d-model", "64"}),
      options);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--d-model: "), std::string::npos) << r.output;
  r = strata::testing::RunCli(ShellQuote({"train", "--resume", dir_ + "/s/0", "--steps", "30"}),
                              options);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("# re-sharding: step "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("written by 2 rank(s)"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// `strata bench step` across 2 ranks: collective bytes and busy time on their own lane
// (comm), per-rank rows, the data check, and a trace per rank with a comm lane.
// A rank that hangs (stopped: alive, connected, silent) is named by the others with how long
// it was silent, after --comm-timeout, instead of "no data from a peer".
TEST_F(TrainMultirankTest, HungRankIsNamedWithHowLongItSentNothing) {
  ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + "/rdv").c_str()));
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kModel.begin(), kModel.end());
  *(std::find(args.begin(), args.end(), "--steps") + 1) = "100000";  // runs until stopped
  args.insert(args.end(), {"--comm-timeout", "3", "--log-every", "1"});
  int fd0 = -1, fd1 = -1;
  const pid_t r0 = SpawnRank(0, 2, dir_ + "/rdv", args, &fd0, dir_ + "/err0");
  const pid_t r1 = SpawnRank(1, 2, dir_ + "/rdv", args, &fd1, dir_ + "/err1");
  std::string seen;
  char buf[512];
  ssize_t n;
  while (seen.find("step     5/") == std::string::npos && (n = read(fd0, buf, sizeof buf)) > 0) {
    seen.append(buf, n);
  }
  ASSERT_NE(seen.find("step     5/"), std::string::npos) << seen << ReadFile(dir_ + "/err0");
  ASSERT_EQ(0, kill(r1, SIGSTOP));
  const auto stopped_at = std::chrono::steady_clock::now();
  int st = 0;
  bool exited = false;
  while (std::chrono::steady_clock::now() - stopped_at < 60s) {
    if (waitpid(r0, &st, WNOHANG) == r0) {
      exited = true;
      break;
    }
    while ((n = read(fd0, buf, sizeof buf)) > 0) seen.append(buf, n);  // keep the pipe drained
    std::this_thread::sleep_for(20ms);
  }
  kill(r1, SIGKILL);
  waitpid(r1, nullptr, 0);
  if (!exited) {
    kill(r0, SIGKILL);
    waitpid(r0, nullptr, 0);
  }
  close(fd0);
  close(fd1);
  ASSERT_TRUE(exited) << "rank 0 hung after rank 1 stopped";
  const std::string err = ReadFile(dir_ + "/err0");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << err;
  EXPECT_NE(err.find("rank 1 sent nothing for 3 s"), std::string::npos) << err;
}

TEST_F(TrainMultirankTest, BenchStepAcrossTwoRanksReportsTheCommLane) {
  ASSERT_EQ(0, std::system(("mkdir -p " + dir_ + "/0 " + dir_ + "/1").c_str()));
  // Rank 0's standard output alone (--output rank0), so that its JSON parses; standard
  // error apart.
  strata::testing::CliRunOptions options;
  options.stderr_to = strata::testing::CliStderr::kFile;
  options.stderr_path = dir_ + "/stderr";
  options.timeout_s = 300;
  const strata::testing::CliRun run =
      strata::testing::RunCli(std::string("launch -n 2 --output rank0 -- ") + STRATA_CLI_PATH +
                                  ShellQuote({"bench",         "step",
                                              "--blocks",      "4",
                                              "--block-bytes", "256K",
                                              "--compute-ms",  "1",
                                              "--device-mem",  "2M",
                                              "--host-mem",    "3M",
                                              "--nvme",        dir_ + "/{rank}",
                                              "--steps",       "2",
                                              "--trace",       dir_ + "/trace.{rank}.json",
                                              "--json",        "-"}),
                              options);
  const std::string& out = run.output;
  ASSERT_EQ(run.exit_code, 0) << out << run.err;
  const size_t brace = out.find('{');
  ASSERT_NE(brace, std::string::npos) << out;
  const nlohmann::json j = nlohmann::json::parse(out.substr(brace), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["config"]["world_size"], 2);
  ASSERT_EQ(j["steps"].size(), 2u);
  for (const auto& s : j["steps"]) {
    EXPECT_GT(s["bytes"]["comm"].get<uint64_t>(), 0u);
    EXPECT_GT(s["busy_seconds"]["comm"].get<double>(), 0.0);
    ASSERT_EQ(s["ranks"].size(), 2u);
    for (const auto& r : s["ranks"]) {
      EXPECT_GT(r["comm_bytes"].get<uint64_t>(), 0u);
      EXPECT_GT(r["efficiency"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(j["steps"][1]["wrong"], 0);
  for (int r = 0; r < 2; ++r) {
    const std::string trace = ReadFile(dir_ + "/trace." + std::to_string(r) + ".json");
    EXPECT_NE(trace.find("\"comm\""), std::string::npos) << "no comm lane in rank " << r;
    EXPECT_NE(trace.find("all-gather block.1"), std::string::npos);
    EXPECT_NE(trace.find("reduce-scatter block.1"), std::string::npos);
  }
}

// `strata train --json -` under `strata launch --output rank0`: standard output is one JSON
// document with what `bench step --json` has per step (bound, stall, busy time), the
// placement and the run's totals; each rank's trace names its rank as its own process.
TEST_F(TrainMultirankTest, JsonOnStandardOutputUnderLaunchAndTracesNameTheirRank) {
  strata::testing::CliRunOptions options;
  options.stderr_to = strata::testing::CliStderr::kFile;
  options.stderr_path = dir_ + "/stderr";
  options.timeout_s = 300;
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kModel.begin(), kModel.end());
  args.insert(args.end(), {"--json", "-", "--trace", dir_ + "/t.{rank}.json", "--trace-steps",
                           "2:3", "--nvme", dir_ + "/n/{rank}", "--host-mem", "1M"});
  const strata::testing::CliRun run = strata::testing::RunCli(
      std::string("launch -n 2 --output rank0 -- ") + STRATA_CLI_PATH + ShellQuote(args), options);
  ASSERT_EQ(run.exit_code, 0) << run.output << run.err;
  const nlohmann::json j = nlohmann::json::parse(run.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << run.output;
  EXPECT_EQ(j["config"]["world_size"], 2);
  ASSERT_EQ(j["steps"].size(), 20u);
  for (const char* k : {"bound_seconds", "bound_resource", "stall_seconds", "busy_seconds",
                        "efficiency", "loss", "bytes"}) {
    EXPECT_TRUE(j["steps"][0].contains(k)) << k;
  }
  EXPECT_GT(j["steps"][0]["busy_seconds"]["comm"].get<double>(), 0.0);
  EXPECT_FALSE(j["placement"]["components"].empty());
  EXPECT_EQ(j["totals"]["steps"], 20);
  EXPECT_EQ(j["totals"]["last_step"], 20);
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(dir_ + "/t." + std::to_string(r) + ".json");
    const nlohmann::json trace = nlohmann::json::parse(f, nullptr, false);
    ASSERT_FALSE(trace.is_discarded()) << "rank " << r;
    bool named = false;
    for (const auto& e : trace["traceEvents"]) {
      EXPECT_EQ(e["pid"], r + 1);
      if (e["name"] == "process_name") {
        named = e["args"]["name"] == "strata rank " + std::to_string(r) + " of 2";
      }
    }
    EXPECT_TRUE(named) << "rank " << r;
  }
}

}  // namespace
