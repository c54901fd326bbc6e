// `strata bench step` end to end (the built binary): each run works in a fresh subfolder of
// every --nvme folder (made when missing) and removes it at exit unless --keep, so a second
// run in the same folder starts as cleanly as the first.
#include <gtest/gtest.h>

#include <filesystem>
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

}  // namespace
