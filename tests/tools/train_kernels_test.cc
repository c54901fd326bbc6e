// Which CUDA kernels a `strata train` run uses (tools/strata/train_kernels.h) and how its
// record names them (run_record.h's [identity] cuda-kernels), and `strata env`'s list of the
// kernel families: none of it needs a GPU.
//
// Run: ctest --test-dir build/release -R 'TrainKernels|StrataEnv'
#include "tools/strata/train_kernels.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "strata/kernel_record.h"
#include "tests/tools/cli_run.h"
#include "tools/strata/run_record.h"

namespace strata::cli {
namespace {

std::string DefaultSpec() { return KernelSelection::Parse("")->ToString(); }
const std::string kTuned =
    "attention=tuned,embedding=tuned,classifier=tuned,matmul=tuned,elementwise=tuned";

// A fresh run: the default is each family's newest variant that has passed on a GPU, and
// the printed lines say for each whether it has run on one.
TEST(TrainKernelsTest, FreshRunUsesTheRecordedDefaultsAndSaysWhatRan) {
  auto k = ChooseRunKernels("", false, "");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->spec, DefaultSpec());
  ASSERT_EQ(k->lines.size(), 1u);
  for (std::string_view family : kSelectableFamilies) {
    const KernelVariant& d = DefaultKernelVariant(family);
    const std::string want = std::string(family) + "=" + std::string(d.variant) +
                             (d.pass.passed() ? " (passed on a GPU: " : " (NEVER RUN ON A GPU)");
    EXPECT_NE(k->lines[0].find(want), std::string::npos) << k->lines[0];
  }
  auto tuned = ChooseRunKernels("tuned", false, "");
  ASSERT_TRUE(tuned.ok());
  EXPECT_EQ(tuned->spec, kTuned);
  EXPECT_NE(tuned->lines[0].find("matmul=tuned (NEVER RUN ON A GPU)"), std::string::npos)
      << "the 2026-12-01 record has no tuned kernel: " << tuned->lines[0];
  EXPECT_EQ(ChooseRunKernels("matmul=fast", false, "").status().code(),
            StatusCode::kInvalidArgument);
}

// A resume after the default changed keeps the run's recorded kernels (its bits) unless
// STRATA_CUDA_KERNELS asks for others, and then says the bits will differ.
TEST(TrainKernelsTest, ResumeKeepsTheRecordedKernelsOrSaysWhyNot) {
  ASSERT_NE(DefaultSpec(), kTuned);  // a run begun with every tuned kernel, before today
  auto kept = ChooseRunKernels("", true, kTuned);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->spec, kTuned);
  ASSERT_EQ(kept->lines.size(), 2u);
  EXPECT_NE(kept->lines[1].find("the same bits as an uninterrupted run"), std::string::npos);
  auto changed = ChooseRunKernels("naive", true, kTuned);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(changed->spec, KernelSelection::Parse("naive")->ToString());
  ASSERT_EQ(changed->lines.size(), 2u);
  EXPECT_NE(changed->lines[1].find("will not be bit-identical"), std::string::npos);
  // The same kernels: nothing to say beyond the list.
  auto same = ChooseRunKernels("", true, DefaultSpec());
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->lines.size(), 1u);
  // A record from before records named kernels: says so and how to keep a tuned run's bits.
  auto old = ChooseRunKernels("", true, "");
  ASSERT_TRUE(old.ok());
  ASSERT_EQ(old->lines.size(), 2u);
  EXPECT_NE(old->lines[1].find("STRATA_CUDA_KERNELS=tuned"), std::string::npos);
  // A record naming a variant this strata lacks: refused, naming the record.
  EXPECT_EQ(ChooseRunKernels("", true, "attention=warp").status().code(),
            StatusCode::kInvalidArgument);
}

// The record carries the kernels in [identity] and reads them back.
TEST(TrainKernelsTest, RecordNamesTheKernels) {
  const std::string dir = ::testing::TempDir() + "/train_kernels_record";
  std::filesystem::create_directories(dir);
  RunIdentity id;
  id.run_id = "0123456789abcdef0123456789abcdef";
  id.cuda_kernels = kTuned;
  ASSERT_TRUE(WriteRunRecord(dir, RunRecordText({}, id)).ok());
  auto back = ReadRunRecord(dir);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ((*back)->identity.cuda_kernels, kTuned);
  id.cuda_kernels.clear();  // a host-device run names none
  ASSERT_TRUE(WriteRunRecord(dir, RunRecordText({}, id)).ok());
  back = ReadRunRecord(dir);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->identity.cuda_kernels, "");
  std::filesystem::remove_all(dir);
}

// `strata env` lists each family's default variant and where each variant last passed.
TEST(StrataEnvTest, ListsTheKernelFamiliesAndTheirRecord) {
  const testing::CliRun r = testing::RunCli("env");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const KernelVariant& v : KernelVariants()) {
    const std::string family = std::string(v.family);
    EXPECT_NE(r.output.find("  " + family), std::string::npos) << family;
    EXPECT_NE(r.output.find(std::string(v.variant) + ": " + DescribePass(v.pass)),
              std::string::npos)
        << family << "=" << v.variant << "\n"
        << r.output;
  }
  EXPECT_NE(r.output.find("default=" + std::string(DefaultKernelVariant("attention").variant)),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace strata::cli
