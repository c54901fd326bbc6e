// The one run-setup path (trainer/run_setup.h): the settings' parsers, the shared defaults,
// the device rule, and the EngineOptions it builds, on one rank (the multi-rank paths run
// in tests/trainer/train_multirank_test.cc and tests/tools/ through the CLI).
#include "trainer/run_setup.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/temp_dir.h"

namespace strata::trainer {
namespace {

// No launcher variables: every test here is one rank.
class RunSetupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
      ::unsetenv(v);
    }
  }
};

TEST_F(RunSetupTest, ParsersAcceptTheirValuesAndNameTheFlagOtherwise) {
  EXPECT_EQ(*ParseDeviceChoice("auto"), DeviceChoice::kAuto);
  EXPECT_EQ(*ParseDeviceChoice("cpu"), DeviceChoice::kCpu);
  EXPECT_EQ(*ParseDeviceChoice("cuda"), DeviceChoice::kCuda);
  EXPECT_EQ(ParseDeviceChoice("gpu").status().message(),
            "--device gpu: expected auto, cpu or cuda");
  EXPECT_EQ(*ParseCommBackendChoice("nccl"), CommBackendChoice::kNccl);
  EXPECT_EQ(ParseCommBackendChoice("mpi").status().message(),
            "--comm-backend mpi: expected auto, gloo or nccl");
  EXPECT_EQ(*ParseCollectiveMemory("host"), CollectiveMemory::kHost);
  EXPECT_EQ(ParseCollectiveMemory("gpu").status().message(),
            "--collective-memory gpu: expected auto, device or host");
}

TEST_F(RunSetupTest, DefaultsAreTheTrainersOwn) {
  // `strata train` and `strata bench step` both start from these.
  const RunConfig c;
  EXPECT_EQ(c.device, DeviceChoice::kAuto);
  EXPECT_EQ(c.grad_clip, 1.0);
  EXPECT_EQ(c.weight_decay, 0.1);
  EXPECT_EQ(c.beta2, 0.95);
  EXPECT_EQ(c.micro_batches, 1);
  EXPECT_TRUE(c.durable);
  EXPECT_EQ(c.comm_backend, CommBackendChoice::kAuto);
}

TEST_F(RunSetupTest, AutoIsTheGpuWhenPresentElseTheHostAndSaysWhich) {
  RunConfig c;
  std::string failed;
  auto setup = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(setup.ok()) << failed << ": " << setup.status().ToString();
  ASSERT_TRUE((*setup)->Start({"strata-test", "/tmp/strata-run-setup-test-"}, &failed).ok())
      << failed;
  const bool gpu = CudaAvailable();
  EXPECT_EQ((*setup)->device().Kind(), gpu ? DeviceKind::kCuda : DeviceKind::kHost);
  EXPECT_EQ((*setup)->DeviceNote(),
            gpu ? "--device auto: a GPU is present" : "--device auto: no GPU, the host device");
  // One rank without --comm-backend nccl: no communicators.
  EXPECT_EQ((*setup)->host_comm(), nullptr);
  EXPECT_EQ((*setup)->engine_comm(), nullptr);

  c.device = DeviceChoice::kCpu;
  auto cpu = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(cpu.ok());
  ASSERT_TRUE((*cpu)->Start({"strata-test", "/tmp/strata-run-setup-test-"}, &failed).ok());
  EXPECT_EQ((*cpu)->device().Kind(), DeviceKind::kHost);
  EXPECT_EQ((*cpu)->DeviceNote(), "");  // named, not chosen
}

TEST_F(RunSetupTest, NcclWithoutAGpuIsRefusedBeforeAnyRankJoins) {
  RunConfig c;
  c.device = DeviceChoice::kCpu;
  c.comm_backend = CommBackendChoice::kNccl;
  std::string failed;
  auto setup = RunSetup::Begin(c, &failed);
  ASSERT_FALSE(setup.ok());
  EXPECT_EQ(failed, "--comm-backend");
  EXPECT_NE(setup.status().message().find("--comm-backend nccl needs --device cuda"),
            std::string::npos);
  EXPECT_NE(setup.status().message().find("--device is cpu"), std::string::npos);
}

TEST_F(RunSetupTest, EngineOptionsCarryTheConfig) {
  strata::testing::TempDir dir("strata_run_setup_test");
  const std::string d = dir.path();
  RunConfig c;
  c.device = DeviceChoice::kCpu;
  c.device_mem_bytes = 1 << 20;
  c.host_mem_bytes = 2 << 20;
  c.nvme = {d + "/a.{rank}", d + "/b.{local_rank}"};
  c.trace = "/tmp/t.{rank}.json";
  c.io = IoBackendKind::kPosix;
  c.cpu_threads = 3;
  c.micro_batches = 2;
  c.grad_clip = 0.5;
  std::string failed;
  auto setup = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(setup.ok());
  ASSERT_TRUE((*setup)->Start({"strata-test", "/tmp/strata-run-setup-test-"}, &failed).ok());
  auto eo = (*setup)->MakeEngineOptions(&failed);
  ASSERT_TRUE(eo.ok()) << eo.status().ToString();
  EXPECT_EQ(eo->device, &(*setup)->device());
  EXPECT_EQ(eo->device_mem_bytes, uint64_t{1} << 20);
  EXPECT_EQ(eo->host_mem_bytes, uint64_t{2} << 20);
  EXPECT_EQ(eo->nvme_paths, (std::vector<std::string>{d + "/a.0", d + "/b.0"}));
  EXPECT_EQ(eo->trace_path, "/tmp/t.0.json");
  EXPECT_EQ(eo->io.kind, IoBackendKind::kPosix);
  EXPECT_EQ(eo->optimizer_threads, 3);
  EXPECT_EQ(eo->micro_batches, 2);
  EXPECT_EQ(eo->grad_clip, 0.5);
  EXPECT_EQ(eo->beta2, 0.95);
  EXPECT_EQ(eo->weight_decay, 0.1);
  EXPECT_TRUE(eo->durable);  // durable with NVMe folders
  EXPECT_FALSE(eo->resume);
  EXPECT_EQ(eo->comm, nullptr);

  // --resume must name one of the --nvme folders; alone it is the NVMe folder.
  c.resume = d + "/elsewhere";
  auto bad = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(bad.ok());
  ASSERT_TRUE((*bad)->Start({"strata-test", "/tmp/strata-run-setup-test-"}, &failed).ok());
  auto refused = (*bad)->MakeEngineOptions(&failed);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(failed, "--resume");
  c.nvme.clear();
  auto alone = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(alone.ok());
  ASSERT_TRUE((*alone)->Start({"strata-test", "/tmp/strata-run-setup-test-"}, &failed).ok());
  auto resumed = (*alone)->MakeEngineOptions(&failed);
  ASSERT_TRUE(resumed.ok());
  EXPECT_TRUE(resumed->resume);
  EXPECT_EQ(resumed->nvme_paths, (std::vector<std::string>{d + "/elsewhere"}));
}

// A missing --nvme folder is made, parents too, and reported, so that a mistyped path is
// told rather than silently filled; one that exists is not reported.
TEST_F(RunSetupTest, MissingNvmeFoldersAreMadeAndReported) {
  strata::testing::TempDir dir("strata_run_setup_test");
  RunConfig c;
  c.device = DeviceChoice::kCpu;
  c.nvme = {dir.path() + "/typo/run.{rank}", dir.path()};
  std::string failed;
  auto setup = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(setup.ok());
  ASSERT_TRUE((*setup)->Start({"strata-test", "/tmp/strata-run-setup-test-"}, &failed).ok());
  std::vector<std::string> made;
  ASSERT_TRUE((*setup)->MakeEngineOptions(&failed, &made).ok());
  EXPECT_EQ(made, (std::vector<std::string>{dir.path() + "/typo/run.0"}));
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() + "/typo/run.0"));
  made.clear();
  ASSERT_TRUE((*setup)->MakeEngineOptions(&failed, &made).ok());
  EXPECT_TRUE(made.empty());
}

TEST_F(RunSetupTest, BatchMustSplitOverTheRanks) {
  RunConfig c;
  c.batch = 7;
  std::string failed;
  EXPECT_TRUE(RunSetup::Begin(c, &failed).ok());  // one rank: any batch splits
  // Rank 0 of 2 (Begin only reads the environment; nothing joins yet).
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  auto two = RunSetup::Begin(c, &failed);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(failed, "--batch");
  EXPECT_NE(two.status().message().find("--batch 7 does not split over 2 ranks"), std::string::npos)
      << two.status().ToString();
  c.batch = 8;
  auto even = RunSetup::Begin(c, &failed);
  ASSERT_TRUE(even.ok()) << even.status().ToString();
  EXPECT_EQ((*even)->rank().world_size, 2);
  EXPECT_EQ((*even)->rank().source, "torchrun");
}

}  // namespace
}  // namespace strata::trainer
