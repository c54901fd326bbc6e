// One vocabulary of flags across the `strata` subcommands (the built binary): `--json FILE`
// with `-` for standard output, which then carries the JSON alone; `--threads` wherever the
// CPU computes; `--help` showing switches' defaults as they are; --nvme folders (each
// rank's, with {rank}) made when missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::CliStderr;
using strata::testing::Contains;
using strata::testing::ShellQuote;

CliRun Shell(const std::string& args, CliStderr err = CliStderr::kMerged) {
  strata::testing::CliRunOptions options;
  options.timeout_s = 120;
  options.stderr_to = err;
  options.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  return strata::testing::RunCli(args, options);
}

const char* kTinyTrain = "train --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 ";

TEST(FlagVocabulary, JsonDashPutsTheJsonAloneOnStandardOutput) {
  strata::testing::TempDir tmp("strata-flags");
  const std::string model = tmp.File("m.safetensors");
  const std::string text = tmp.File("text.txt");
  {
    std::string s;
    for (int i = 0; i < 400; ++i) s += "the quick brown fox jumps over the lazy dog. ";
    std::FILE* f = std::fopen(text.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(s.c_str(), f);
    std::fclose(f);
  }
  const std::string commands[] = {
      std::string(kTinyTrain) + "--steps 2 --save" + ShellQuote({model}),
      "eval --init" + ShellQuote({model, "--data", text}) + " --seq-len 16",
      "bench step --blocks 2 --block-bytes 64K --compute-ms 0 --steps 1",
      "bench adam --params 64K --iters 1",
      "bench model --model 1x64 --reps 1 --batch 2 --seq-len 16",
      "bench io --path" + ShellQuote({tmp.path()}) + " --size 1M --block 256K --iters 1 --warmup 0",
  };
  for (const std::string& cmd : commands) {
    const CliRun r = Shell(cmd + " --json -", CliStderr::kDiscarded);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << cmd << "\n" << r.output;
  }
}

TEST(FlagVocabulary, ThreadsOnEverySubcommandThatComputes) {
  for (const char* cmd : {"train", "eval", "generate", "bench step", "bench adam", "bench model"}) {
    const CliRun r = Shell(std::string(cmd) + " --help");
    EXPECT_TRUE(Contains(r.output, "--threads")) << cmd << "\n" << r.output;
    EXPECT_FALSE(Contains(r.output, "--cpu-threads")) << cmd;
  }
  const CliRun r = Shell(std::string(kTinyTrain) + "--steps 1 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(FlagVocabulary, HelpShowsSwitchDefaultsAsTheyAre) {
  const CliRun train = Shell("train --help");
  EXPECT_FALSE(Contains(train.output, "{false}")) << train.output;
  const size_t durable = train.output.find("  --durable ");
  ASSERT_NE(durable, std::string::npos) << train.output;
  const std::string line = train.output.substr(durable, train.output.find('\n', durable) - durable);
  EXPECT_TRUE(Contains(line, "(default: on)")) << line;
  EXPECT_TRUE(Contains(train.output, "--no-durable")) << train.output;
  const CliRun io = Shell("bench io --help");
  EXPECT_FALSE(Contains(io.output, "{false}")) << io.output;
  EXPECT_TRUE(Contains(io.output, "--no-direct")) << io.output;
}

TEST(FlagVocabulary, MissingNvmeFoldersAreMadeForEachRank) {
  strata::testing::TempDir tmp("strata-flags");
  const std::string nvme = tmp.File("not/yet/{rank}");
  const CliRun r =
      Shell(std::string(kTinyTrain) + "--steps 2 --host-mem 1M --nvme" + ShellQuote({nvme}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_directory(tmp.File("not/yet/0"))) << r.output;
}

// Budget checks report every short budget at once, each with its minimum.
TEST(FlagVocabulary, EveryShortBudgetIsReportedAtOnce) {
  strata::testing::TempDir tmp("strata-flags");
  const CliRun r =
      Shell(std::string(kTinyTrain) + "--steps 1 --device-mem 1K --host-mem 1K --nvme" +
            ShellQuote({tmp.File("nvme")}));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "device budget 1.0 KiB")) << r.output;
  EXPECT_TRUE(Contains(r.output, "host budget 1.0 KiB")) << r.output;
}

// A folder holding an earlier run's store: the message says how to continue it in flags,
// never in API names.
TEST(FlagVocabulary, AnEarlierRunsStoreIsExplainedInFlags) {
  strata::testing::TempDir tmp("strata-flags");
  const std::string run =
      std::string(kTinyTrain) + "--steps 1 --nvme" + ShellQuote({tmp.File("n")});
  ASSERT_EQ(Shell(run).exit_code, 0);
  const CliRun again = Shell(run);
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_TRUE(Contains(again.output, "Resume that run (--resume " + tmp.File("n"))) << again.output;
  EXPECT_FALSE(Contains(again.output, "EngineOptions")) << again.output;
}

}  // namespace
