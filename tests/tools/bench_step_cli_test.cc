// `strata bench step` end to end (the built binary): each run works in a fresh subfolder of
// every --nvme folder (made when missing) and removes it at exit unless --keep, so a second
// run in the same folder starts as cleanly as the first.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Contains;
using strata::testing::ShellQuote;

CliRun Shell(const std::string& args) {
  strata::testing::CliRunOptions options;
  options.timeout_s = 120;
  options.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  return strata::testing::RunCli(args, options);
}

int Entries(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.exists() ? 1 : 0;
  return n;
}

const char* kTinyBench =
    "bench step --blocks 3 --block-bytes 64K --compute-ms 0 --steps 2 --device-mem unlimited "
    "--host-mem 512K";

TEST(BenchStepCli, RunsTwiceInTheSameNvmeFolderAndLeavesItEmpty) {
  strata::testing::TempDir tmp("strata-bench-step");
  const std::string nvme = tmp.File("missing/nvme");  // made by the run
  for (int run = 0; run < 2; ++run) {
    const CliRun r = Shell(std::string(kTinyBench) + " --nvme" + ShellQuote({nvme}));
    ASSERT_EQ(r.exit_code, 0) << "run " << run << "\n" << r.output;
    EXPECT_FALSE(Contains(r.output, "resume")) << r.output;
    ASSERT_TRUE(std::filesystem::is_directory(nvme));
    EXPECT_EQ(Entries(nvme), 0) << "run " << run << " left its state behind";
  }
}

TEST(BenchStepCli, KeepLeavesTheSubfolderAndSaysWhere) {
  strata::testing::TempDir tmp("strata-bench-step");
  const std::string nvme = tmp.File("nvme");
  const CliRun r = Shell(std::string(kTinyBench) + " --keep --nvme" + ShellQuote({nvme}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(Entries(nvme), 1) << r.output;
  const std::string kept = std::filesystem::directory_iterator(nvme)->path().string();
  EXPECT_TRUE(Contains(r.output, "kept the NVMe state in " + kept)) << r.output;
  EXPECT_GT(Entries(kept), 0) << "the kept subfolder holds the store";
}

// With pipelined updates (the default with --grad-clip) a step's own updates run under the
// next one: each row is a step that committed, with its own updates' NVMe writes, so the
// figures equal --pipeline off's step for step (they were the previous step's before).
TEST(BenchStepCli, PipelinedRowsAreCommittedStepsWithTheirOwnWrites) {
  strata::testing::TempDir tmp("strata-bench-step");
  auto writes = [&](const std::string& pipeline, std::string* output) {
    const CliRun r = Shell(
        "bench step --blocks 3 --block-bytes 64K --compute-ms 0 --steps 3 --device-mem "
        "unlimited --host-mem 512K --json - --pipeline " +
        pipeline + " --nvme" + ShellQuote({tmp.File("nvme-" + pipeline)}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    *output = r.output;
    std::vector<std::pair<int, double>> out;  // (step, nvme bytes written)
    const auto at = r.output.find('{');
    if (r.exit_code != 0 || at == std::string::npos) return out;
    const auto j = nlohmann::json::parse(r.output.substr(at), nullptr, false);
    if (j.is_discarded()) return out;
    for (const auto& st : j["steps"]) {
      out.push_back({st["step"].get<int>(), st["bytes"]["nvme_write"].get<double>()});
      EXPECT_EQ(st["deferred_blocks"].get<int>(), pipeline == "on" ? 3 : 0) << r.output;
    }
    EXPECT_EQ(j["steps"].back()["wrong"], 0);
    return out;
  };
  std::string on_out, off_out;
  const auto on = writes("on", &on_out);
  const auto off = writes("off", &off_out);
  ASSERT_EQ(on.size(), 3u) << on_out;
  EXPECT_EQ(on, off) << on_out << "\n" << off_out;
  for (int s = 0; s < 3; ++s) EXPECT_EQ(on[s].first, s + 1) << on_out;
  EXPECT_GT(on[0].second, 0) << on_out;
}

// Compact states (issue 42): a step writes every state (durable), int8 moments with a bf16
// master (the bf16 params themselves) 4 bytes and the scales per parameter against fp32's 12,
// exactly the bytes the placement predicts; the zero-gradient self-check holds (#wrong 0).
TEST(BenchStepCli, Int8MomentsAndABf16MasterWriteAThirdOfTheBytes) {
  strata::testing::TempDir tmp("strata-bench-step");
  auto writes = [&](const std::string& flags) {
    const CliRun r = Shell(std::string(kTinyBench) + " --grad-clip 0 --json - " + flags +
                           " --nvme" + ShellQuote({tmp.File("nvme")}));
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    const auto at = r.output.find('{');
    if (r.exit_code != 0 || at == std::string::npos) return -1.0;
    const auto j = nlohmann::json::parse(r.output.substr(at), nullptr, false);
    if (j.is_discarded()) return -1.0;
    const auto& last = j["steps"].back();
    EXPECT_EQ(last["wrong"], 0) << flags;
    EXPECT_EQ(last["bytes"]["nvme_write"], j["placement"]["predicted_bytes"]["nvme_write"])
        << flags << "\n"
        << r.output;
    return last["bytes"]["nvme_write"].get<double>();
  };
  const double fp32 = writes("");
  const double int8 = writes("--state-dtype int8");
  const double compact = writes("--state-dtype int8 --master-dtype bf16");
  EXPECT_GT(compact, 0);
  EXPECT_LE(int8, 0.55 * fp32);
  EXPECT_LE(compact, 0.36 * fp32);
}

// Layer-major micro-batches: per step each block's params and gradient cross as with one
// micro-batch, the activations the extra micro-batches keep come out of --device-mem (the
// start-up line says how much), and a budget they do not fit is refused when forced.
TEST(BenchStepCli, LayerMajorMovesTheBytesOfOneMicroBatch) {
  const std::string bench =
      "bench step --device cpu --blocks 3 --block-bytes 64K --compute-ms 0 --steps 2 "
      "--device-mem 512K --activation-bytes 64K --json -";
  auto step_bytes = [&](const std::string& flags, std::string* output) {
    const CliRun r = Shell(bench + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    *output = r.output;
    const auto at = r.output.find('{');
    if (r.exit_code != 0 || at == std::string::npos) return std::pair<double, double>{-1, -1};
    const auto j = nlohmann::json::parse(r.output.substr(at), nullptr, false);
    if (j.is_discarded()) return std::pair<double, double>{-1, -1};
    const auto& last = j["steps"].back();
    EXPECT_EQ(last["wrong"], 0) << flags;
    return std::pair<double, double>{last["bytes"]["h2d"].get<double>(),
                                     last["bytes"]["d2h"].get<double>()};
  };
  std::string one_out, layer_out, batch_out;
  const auto one = step_bytes("--micro-batches 1", &one_out);
  const auto layer = step_bytes("--micro-batches 4 --micro-batch-order layer", &layer_out);
  const auto batch = step_bytes("--micro-batches 4 --micro-batch-order batch", &batch_out);
  EXPECT_EQ(layer.second, one.second) << layer_out;
  EXPECT_LE(layer.first, 1.1 * one.first) << layer_out;
  EXPECT_EQ(batch.second, 4 * one.second) << batch_out;
  EXPECT_TRUE(Contains(layer_out, "activations of 3 more micro-batches in flight (192.0 KiB)"))
      << layer_out;
  const CliRun refused = Shell(bench + " --micro-batches 9 --micro-batch-order layer");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(Contains(refused.output, "--micro-batch-order layer")) << refused.output;
}

// --activation-stash: every block's forward stashes --activation-bytes per micro-batch in the
// engine and its backward fetches them; the JSON reports the stash's bytes per link, and at
// the host minimum the activations spill to NVMe and come back right (#wrong 0).
TEST(BenchStepCli, ActivationStashReportsItsBytesPerLink) {
  strata::testing::TempDir tmp("strata-bench-step");
  const std::string bench =
      "bench step --device cpu --blocks 3 --block-bytes 64K --compute-ms 0 --steps 3 "
      "--device-mem unlimited --micro-batches 2 --micro-batch-order layer "
      "--activation-bytes 40K --activation-stash --json - --nvme" +
      ShellQuote({tmp.File("nvme")});
  auto run = [&](const std::string& host_mem, nlohmann::json* out) {
    const CliRun r = Shell(bench + " --host-mem " + host_mem);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto at = r.output.find('{');
    ASSERT_NE(at, std::string::npos) << r.output;
    *out = nlohmann::json::parse(r.output.substr(at), nullptr, false);
    ASSERT_FALSE(out->is_discarded()) << r.output;
    EXPECT_EQ((*out)["steps"].back()["wrong"], 0) << r.output;
  };
  nlohmann::json roomy, tight;
  run("64M", &roomy);
  const uint64_t per_step = 3 * 2 * 40960;  // blocks x micro-batches x bytes
  for (const auto& st : roomy["steps"]) {
    EXPECT_EQ(st["activation_bytes"]["d2h"].get<uint64_t>(), per_step);
    EXPECT_EQ(st["activation_bytes"]["h2d"].get<uint64_t>(), per_step);
    EXPECT_EQ(st["activation_bytes"]["nvme_write"].get<uint64_t>(), 0u);
    EXPECT_GE(st["bytes"]["d2h"].get<uint64_t>(), per_step);
  }
  EXPECT_EQ(roomy["placement"]["activation_host_slots"], 6);
  const uint64_t min = roomy["placement"]["host_min_bytes"].get<uint64_t>();
  run(std::to_string(min), &tight);
  EXPECT_EQ(tight["placement"]["activation_host_slots"], 3);
  uint64_t written = 0, read = 0;
  for (const auto& st : tight["steps"]) {
    EXPECT_EQ(st["activation_bytes"]["h2d"].get<uint64_t>(), per_step);
    written += st["activation_bytes"]["nvme_write"].get<uint64_t>();
    read += st["activation_bytes"]["nvme_read"].get<uint64_t>();
  }
  // Layer-major: all 6 are live at the end of forward with 3 host slots, so at least 3 were
  // written (a Stash waits for a spill to free its slot) and must be read back.
  EXPECT_GE(written, 3u * 3 * 40960);
  EXPECT_GE(read, 3u * 3 * 40960);
}

}  // namespace
