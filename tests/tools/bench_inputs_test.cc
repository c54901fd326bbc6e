// Tests of the inputs every `strata bench` command shares: sizes parsed by the one byte/count
// parser (an overflow is an error, not a wrap), sizes refused by name before anything is
// allocated, and output paths checked before the run rather than after it. Each runs the
// built strata binary (STRATA_CLI_PATH).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tests/io/io_test_util.h"
#include "tests/tools/cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::Contains;

CliRun Strata(const std::string& args) {
  testing::CliRunOptions options;
  options.timeout_s = 120;
  return testing::RunCli(args, options);
}

// 17179869184G is 2^64 parameters: the old parser multiplied it into 0 and benchmarked that.
TEST(BenchInputs, AdamParamsThatOverflowAreRefusedNotWrapped) {
  const CliRun r = Strata("bench adam --params 17179869184G --iters 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--params 17179869184G is not a size")) << r.output;
  EXPECT_FALSE(Contains(r.output, "avx")) << "a case ran:\n" << r.output;
}

// A negative count used to wrap to 2^64 - 5 and end in train's out-of-memory message.
TEST(BenchInputs, AdamNegativeParamsAreRefusedByName) {
  const CliRun r = Strata("bench adam --params -5 --iters 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--params -5 is not a size")) << r.output;
  EXPECT_FALSE(Contains(r.output, "--batch")) << r.output;  // train's out-of-memory advice
}

// 1024T parameters fit in no host: refused naming --params and the host's memory, before
// any allocation (not train's "lower --batch, --seq-len" out-of-memory message).
TEST(BenchInputs, AdamParamsBeyondHostMemoryAreRefusedByName) {
  const CliRun r = Strata("bench adam --params 1024T --iters 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--params 1024T")) << r.output;
  EXPECT_TRUE(Contains(r.output, "of memory; lower --params")) << r.output;
  EXPECT_FALSE(Contains(r.output, "--batch")) << r.output;
}

TEST(BenchInputs, AdamZeroParamsAreRefused) {
  const CliRun r = Strata("bench adam --params 0 --iters 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "--params 0: give at least 1 parameter")) << r.output;
}

// A bf16 master takes no fp16 gradients: the case is skipped and said so, and a selection of
// nothing but such cases is an error (it printed an empty table and exited 0).
TEST(BenchInputs, AdamSkippedCasesAreCountedAndNoCaseLeftIsAnError) {
  const CliRun none =
      Strata("bench adam --params 64K --grad-dtype fp16 --master-dtype bf16-sr --iters 1");
  EXPECT_NE(none.exit_code, 0) << none.output;
  EXPECT_TRUE(Contains(none.output, "skipped 1 case(s)")) << none.output;
  EXPECT_TRUE(Contains(none.output, "no case left to run")) << none.output;
  const CliRun some =
      Strata("bench adam --params 64K --grad-dtype fp16,fp32 --master-dtype bf16-sr --iters 1");
  EXPECT_EQ(some.exit_code, 0) << some.output;
  EXPECT_TRUE(Contains(some.output, "skipped 1 case(s)")) << some.output;
}

// A --json that cannot be written is refused before the benchmark runs: each command below
// would run for minutes, and the test's two-minute guard fails the old behaviour (which
// reported the path after the run) with exit code 137 or a printed table.
TEST(BenchInputs, EveryBenchCommandChecksItsJsonPathBeforeTheRun) {
  testing::TempDir dir;
  const std::string bad = " --json " + dir.path() + "/missing/out.json";
  const std::string commands[] = {
      "bench adam --params 64M --iters 100000",
      "bench model --model 6x384 --reps 100000",
      "bench step --blocks 2 --block-bytes 1M --compute-ms 1000 --steps 100000",
      "bench io --path " + dir.path() + " --size 16M --iters 100000",
  };
  for (const std::string& cmd : commands) {
    const auto t0 = std::chrono::steady_clock::now();
    const CliRun r = Strata(cmd + bad);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 1) << cmd << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "missing/out.json")) << cmd << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "does not exist")) << cmd << "\n" << r.output;
    EXPECT_LT(secs, 30) << cmd << ": the path was checked after the run";
  }
}

}  // namespace
}  // namespace strata
