// Engine::SetOptimizerThreads: the CPU optimizer's team changes between steps (the Python CPU
// engine's LoadWatch does it when other processes take the CPU) and no result bit changes, also
// for the updates a pipelined step carries into the next one; during a step, or to a negative
// count, it is refused.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "strata/engine.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

TEST(EngineThreadsTest, ChangingTheTeamBetweenStepsChangesNoBit) {
  std::mt19937_64 rng(7);
  const std::vector<BlockSpec> specs = RandomModel(rng, 4);
  for (double clip : {0.0, 1e-3}) {  // 1e-3: every step clips, so every update is carried
    SCOPED_TRACE("grad_clip " + std::to_string(clip));
    TempDir a, b;
    RunConfig rc;
    rc.grad_clip = clip;
    rc.micro_batches = 2;
    rc.nvme = a.path();
    auto ref = Train(specs, rc, 6);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();

    rc.nvme = b.path();
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    RunRecord rec;
    ASSERT_TRUE(f->engine->SetOptimizerThreads(1).ok());
    ASSERT_TRUE(RunSteps(*f, 1, 2, rc.micro_batches, &rec).ok());
    ASSERT_TRUE(f->engine->SetOptimizerThreads(2).ok());
    ASSERT_TRUE(RunSteps(*f, 3, 4, rc.micro_batches, &rec).ok());
    ASSERT_TRUE(f->engine->SetOptimizerThreads(0).ok());
    ASSERT_TRUE(RunSteps(*f, 5, 6, rc.micro_batches, &rec).ok());
    auto states = States(*f->engine);
    ASSERT_TRUE(states.ok()) << states.status().ToString();
    EXPECT_TRUE(BitIdentical(ref->states, *states));
    EXPECT_EQ(rec.norms, ref->rec.norms);
    if (clip > 0) {
      EXPECT_GT(rec.deferred_blocks, 0);
    }
  }
}

TEST(EngineThreadsTest, DuringAStepOrANegativeCountIsRefused) {
  std::mt19937_64 rng(8);
  const std::vector<BlockSpec> specs = RandomModel(rng, 2);
  auto f = MakeEngine(specs, RunConfig{});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Status s = f->engine->SetOptimizerThreads(-1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 0"), std::string::npos) << s.ToString();
  ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
  s = f->engine->SetOptimizerThreads(1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("during a step"), std::string::npos) << s.ToString();
  ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, 1, 0).ok());
  ASSERT_TRUE(f->engine->EndStep().ok());
  EXPECT_TRUE(f->engine->SetOptimizerThreads(1).ok());
}

}  // namespace
}  // namespace strata
