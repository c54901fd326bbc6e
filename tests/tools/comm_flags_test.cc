// Tests of the flags that choose how `strata train` and `strata bench step` run their
// collectives (--comm-backend, --collective-memory): bad values are refused with a message
// naming the flag and the value, and NCCL without a CUDA device is refused before any rank
// tries to meet the others. Each case is one short process of the built strata binary
// (STRATA_CLI_PATH); none needs a GPU.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "tests/temp_dir.h"
#include "tests/tools/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Contains;

// One run of the binary, without the rank variables of an enclosing launcher (this must be
// a one-rank run).
CliRun Shell(const std::string& args) {
  strata::testing::CliRunOptions options;
  options.timeout_s = 60;
  options.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "STRATA_RENDEZVOUS"};
  return strata::testing::RunCli(args, options);
}

// A model small enough that a run which got past the flags would finish in well under a
// second: the refusals below must come from the flag checks, not from anything slower.
const char* kTinyTrain =
    "train --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch 2 --steps 1 ";
const char* kTinyBench = "bench step --blocks 2 --block-bytes 64K --compute-ms 0 --steps 1 ";

TEST(CommFlags, TrainRefusesABadCommBackend) {
  const CliRun r = Shell(std::string(kTinyTrain) + "--comm-backend mpi");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--comm-backend mpi: expected auto, gloo or nccl")) << r.output;
}

TEST(CommFlags, TrainRefusesABadCollectiveMemory) {
  const CliRun r = Shell(std::string(kTinyTrain) + "--collective-memory gpu");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--collective-memory gpu: expected auto, device or host"))
      << r.output;
}

TEST(CommFlags, TrainRefusesNcclWithoutACudaDevice) {
  for (const char* device : {"cpu", "auto"}) {
    const CliRun r = Shell(std::string(kTinyTrain) + "--comm-backend nccl --device " + device);
    EXPECT_NE(r.exit_code, 0) << device << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "--comm-backend nccl needs --device cuda")) << r.output;
    EXPECT_TRUE(Contains(r.output, std::string("--device is ") + device)) << r.output;
    // Refused before the run starts: no step line, no start-up report.
    EXPECT_FALSE(Contains(r.output, "step ")) << r.output;
    EXPECT_FALSE(Contains(r.output, "# strata train")) << r.output;
  }
}

TEST(CommFlags, TrainAcceptsEveryGoodValueOnOneRank) {
  // With one rank there are no collectives: every value but nccl (which needs a GPU) runs.
  for (const char* flags :
       {"--comm-backend gloo --collective-memory host",
        "--comm-backend auto --collective-memory device", "--collective-memory auto"}) {
    const CliRun r = Shell(std::string(kTinyTrain) + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "step     1/1")) << flags << "\n" << r.output;
  }
}

TEST(CommFlags, BenchStepRefusesBadValues) {
  const CliRun backend = Shell(std::string(kTinyBench) + "--comm-backend tcp");
  EXPECT_NE(backend.exit_code, 0) << backend.output;
  EXPECT_TRUE(Contains(backend.output, "--comm-backend tcp: expected auto, gloo or nccl"))
      << backend.output;
  const CliRun memory = Shell(std::string(kTinyBench) + "--collective-memory pinned");
  EXPECT_NE(memory.exit_code, 0) << memory.output;
  EXPECT_TRUE(Contains(memory.output, "--collective-memory pinned: expected auto, device or host"))
      << memory.output;
}

TEST(CommFlags, BenchStepRefusesNcclOnTheHostDevice) {
  const CliRun r = Shell(std::string(kTinyBench) + "--comm-backend nccl --device cpu");
  EXPECT_NE(r.exit_code, 0) << r.output;
  // The same refusal as `strata train`'s: one run-setup path.
  EXPECT_TRUE(Contains(r.output, "--comm-backend nccl needs --device cuda")) << r.output;
  EXPECT_TRUE(Contains(r.output, "--device is cpu")) << r.output;
  EXPECT_FALSE(Contains(r.output, "#wrong")) << r.output;  // no bench ran
}

TEST(CommFlags, HelpExplainsTheFlags) {
  for (const char* cmd : {"train --help", "bench step --help"}) {
    const CliRun r = Shell(cmd);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "--comm-backend")) << cmd;
    EXPECT_TRUE(Contains(r.output, "--collective-memory")) << cmd;
    EXPECT_TRUE(Contains(r.output, "LOCAL_RANK")) << cmd;
  }
}

// `command --run-secret-file` (train, bench comm): two ranks (under launch, whose own fresh
// secret the flag overrides) that read one file run; ranks given files with other secrets
// refuse each other's keys and time out naming the key; a file other users may read is
// refused before the ranks meet.
void TakesTheRunSecretFromAFile(const std::string& command) {
  strata::testing::TempDir tmp("strata-secret-file");
  auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    std::ofstream(tmp.File(name)) << text << "\n";
    ::chmod(tmp.File(name).c_str(), mode);
  };
  write("same0", "one-secret", 0600);
  write("same1", "one-secret", 0600);
  write("other1", "another-secret", 0600);
  write("open0", "one-secret", 0644);
  write("open1", "one-secret", 0644);
  auto launch = [&](const std::string& file) {
    const std::string run = std::string(STRATA_CLI_PATH) + " " + command +
                            "--comm-timeout 5 --run-secret-file " + tmp.File(file) + "$RANK";
    return Shell("launch -n 2 -- sh -c " + strata::testing::ShellQuote({"exec " + run}));
  };
  const CliRun same = launch("same");
  EXPECT_EQ(same.exit_code, 0) << same.output;
  // Rank 1 reads other1: "other" names no rank-0 file, so give rank 0 same0 by a link.
  ASSERT_EQ(::symlink(tmp.File("same0").c_str(), tmp.File("other0").c_str()), 0);
  const CliRun other = launch("other");
  EXPECT_NE(other.exit_code, 0) << other.output;
  EXPECT_TRUE(Contains(other.output, "does not verify")) << other.output;
  const CliRun open = launch("open");
  EXPECT_NE(open.exit_code, 0) << open.output;
  EXPECT_TRUE(Contains(open.output, "chmod 600 " + tmp.File("open"))) << open.output;
}

TEST(CommFlags, TrainTakesTheRunSecretFromAFile) { TakesTheRunSecretFromAFile(kTinyTrain); }

// bench comm joins ranks too, and takes the secret as train and launch do.
TEST(CommFlags, BenchCommTakesTheRunSecretFromAFile) {
  TakesTheRunSecretFromAFile(
      "bench comm --op all-reduce --backend gloo --min-bytes 64 --max-bytes 64 --iters 1 "
      "--warmup 0 --tcp-bytes 0 ");
}

}  // namespace
