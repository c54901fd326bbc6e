// Engine::GradNorm: the step's global norm, asked for before EndStep (what torch's
// clip_grad_norm_ on an offloaded model returns), is exactly the StepStats::grad_norm EndStep
// then reports, whether the updates speculate, wait for the norm or are pipelined into the next
// step, in memory or at the tight NVMe budgets; and it is refused, by name, where no norm can
// come before the updates (clipping off) or before every gradient is in.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/engine.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

// `steps` steps that ask GradNorm before each EndStep; returns (GradNorm, EndStep's norm).
Result<std::vector<std::pair<double, double>>> NormsBeforeAndAtEndStep(Fixture& f, int steps,
                                                                       int micro_batches) {
  std::vector<std::pair<double, double>> out;
  for (int64_t step = 1; step <= steps; ++step) {
    STRATA_RETURN_IF_ERROR(f.engine->BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}));
    for (int m = 0; m < micro_batches; ++m) {
      STRATA_RETURN_IF_ERROR(testing::RunFakeMicroBatch(*f.engine, *f.device, step, m));
    }
    STRATA_ASSIGN_OR_RETURN(const double before, f.engine->GradNorm());
    STRATA_ASSIGN_OR_RETURN(const StepStats st, f.engine->EndStep());
    out.emplace_back(before, st.grad_norm);
  }
  return out;
}

TEST(EngineGradNormTest, BeforeEndStepIsEndStepsNormBitForBit) {
  const std::vector<BlockSpec> specs = ThreeBlockModel();
  for (double clip : {1e30, 1e-3}) {  // never clips; clips every step (speculative redo)
    for (Speculation s : {Speculation::kOff, Speculation::kOn, Speculation::kAuto}) {
      for (bool pipeline : {false, true}) {
        TempDir dir;
        RunConfig rc = TightNvme(specs, dir.path(), /*mb=*/2, clip);
        rc.speculation = s;
        rc.pipeline = pipeline;
        SCOPED_TRACE("clip " + std::to_string(clip) + " speculation " + SpeculationName(s) +
                     " pipeline " + std::to_string(pipeline));
        auto f = MakeEngine(specs, rc);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        auto norms = NormsBeforeAndAtEndStep(*f, 3, rc.micro_batches);
        ASSERT_TRUE(norms.ok()) << norms.status().ToString();
        for (const auto& [before, at_end] : *norms) {
          EXPECT_GT(before, 0.0);
          EXPECT_EQ(before, at_end);  // the same double, not a recomputation
        }
        // The same run without asking: the same norms (asking changes nothing).
        TempDir dir2;
        RunConfig plain = rc;
        plain.nvme = dir2.path();
        auto trained = Train(specs, plain, 3);
        ASSERT_TRUE(trained.ok()) << trained.status().ToString();
        for (size_t i = 0; i < norms->size(); ++i) {
          EXPECT_EQ((*norms)[i].second, trained->rec.norms[i]);
        }
      }
    }
  }
}

TEST(EngineGradNormTest, RefusedWithoutClippingAndBeforeTheLastGradient) {
  const std::vector<BlockSpec> specs = ThreeBlockModel();
  RunConfig rc;
  rc.micro_batches = 2;
  auto f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
  ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, 1, 0).ok());
  ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, 1, 1).ok());
  auto norm = f->engine->GradNorm();
  ASSERT_FALSE(norm.ok());
  EXPECT_EQ(norm.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(norm.status().message().find("grad_clip"), std::string::npos);
  ASSERT_TRUE(f->engine->EndStep().ok());

  rc.grad_clip = 1.0;
  auto g = MakeEngine(specs, rc);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(g->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
  ASSERT_TRUE(testing::RunFakeMicroBatch(*g->engine, *g->device, 1, 0).ok());
  auto early = g->engine->GradNorm();  // one micro-batch of two
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.status().message().find("every gradient"), std::string::npos);
  ASSERT_TRUE(testing::RunFakeMicroBatch(*g->engine, *g->device, 1, 1).ok());
  auto now = g->engine->GradNorm();
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  auto st = g->engine->EndStep();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*now, st->grad_norm);
}

}  // namespace
}  // namespace strata
