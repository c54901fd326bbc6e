// Non-finite gradients on a HostDevice: a NaN or infinity anywhere skips the whole step,
// clipping or not, and nothing of it is committed (undone from NVMe where updates already
// ran); the step's time splits into compute, stall and tail.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/fault_injection.h"
#include "strata/log.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

// One step whose gradients are 0.01 everywhere except a NaN in block `nan_block` (-1: none).
Result<StepStats> StepWithNan(const Fixture& f, int nan_block) {
  return StepWithGradients(f, [nan_block](int b, float* grad, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) grad[i] = 0.01f;
    if (b == nan_block) grad[3] = std::nanf("");
  });
}

// A non-finite gradient in the block whose gradient lands first (the LM head, where a
// non-finite loss shows first) skips the whole step, clipping or not: no state changes, and
// the commit keeps the last good states (a reopened store reads them back).
class EngineNonFiniteTest : public ::testing::TestWithParam<double> {};

TEST_P(EngineNonFiniteTest, NonFiniteGradientSkipsTheWholeStep) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  const int L = int(specs.size());
  TempDir dir;
  RunConfig rc = TightNvme(specs, dir.path(), 1, GetParam());
  std::vector<std::vector<float>> before;
  {
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto good = StepWithNan(*f, -1);  // step 1: a real update
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    EXPECT_FALSE(good->skipped);
    auto s = States(*f->engine);
    ASSERT_TRUE(s.ok());
    before = *s;
    auto st = StepWithNan(*f, L - 1);  // step 2: NaN in the first gradient to land
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_TRUE(st->skipped);
    EXPECT_TRUE(std::isnan(st->grad_norm));
    auto after = States(*f->engine);
    ASSERT_TRUE(after.ok());
    EXPECT_TRUE(BitIdentical(before, *after));
  }
  RunConfig again = rc;
  again.resume = true;
  auto reopened = MakeEngine(specs, again, /*init_params=*/false);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  auto s = States(*reopened->engine);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(BitIdentical(before, *s));
  SetLogSink(nullptr);
}

INSTANTIATE_TEST_SUITE_P(ClipOnAndOff, EngineNonFiniteTest, ::testing::Values(1.0, 0.0));

// The step's time splits into compute, stall (before the last compute operation) and the
// serial tail after it; with clipping on every update waits for the global norm, so the
// whole optimizer runs in the tail.
TEST(EngineTraceTest, StepTimeSplitsIntoComputeStallAndTail) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  TempDir dir;
  RunConfig rc = TightNvme(specs, dir.path(), 1, 1.0);
  rc.speculation = Speculation::kOff;  // the updates wait for the norm (see the speculation test)
  rc.pipeline = false;                 // at the end of the step (see engine_pipeline_test.cc)
  auto f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
    ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, step, 0).ok());
    auto st = f->engine->EndStep();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    const double compute = st->busy_seconds[int(Resource::kCompute)];
    const double optim = st->busy_seconds[int(Resource::kCpuOptim)];
    EXPECT_GT(st->tail_seconds, 0.0);
    EXPECT_GE(st->stall_seconds, 0.0);
    EXPECT_GT(optim, 0.0);
    EXPECT_GE(st->tail_seconds, optim) << "an update ran before the last backward";
    EXPECT_NEAR(compute + st->stall_seconds + st->tail_seconds, st->seconds,
                1e-6 + 1e-6 * st->seconds);
    EXPECT_EQ(st->redone_blocks, 0);
  }
  SetLogSink(nullptr);
}

// With clipping a NaN in any block skips the step: every update waits for the global norm.
TEST(EngineNumericsTest, NonFiniteGradientAnywhereSkipsTheUpdateWithClipping) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  TempDir dir;
  auto f = MakeEngine(specs, TightNvme(specs, dir.path(), 1, 1.0));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto before = States(*f->engine);
  ASSERT_TRUE(before.ok());
  auto st = StepWithNan(*f, 0);  // the last gradient to land
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->skipped);
  auto after = States(*f->engine);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(BitIdentical(*before, *after));
  SetLogSink(nullptr);
}

// Without clipping, a NaN in the last gradient to land is found after the other blocks were
// updated: EndStep refuses to commit that step, names what to do, and a reopened store
// holds the last good commit.
TEST(EngineNumericsTest, LateNonFiniteGradientWithoutClippingIsNeverCommitted) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  TempDir dir;
  RunConfig rc = TightNvme(specs, dir.path(), 1, 0.0);
  rc.speculation = Speculation::kOff;  // no undo: the step is refused (see below for the undo)
  std::vector<std::vector<float>> good_states;
  {
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE(StepWithNan(*f, -1).ok());
    auto s = States(*f->engine);
    ASSERT_TRUE(s.ok());
    good_states = *s;
    auto st = StepWithNan(*f, 0);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kAborted) << st.status().ToString();
    EXPECT_NE(st.status().message().find("not committed"), std::string::npos)
        << st.status().ToString();
    EXPECT_NE(st.status().message().find("step 1 stays the last good commit"), std::string::npos)
        << st.status().ToString();
    EXPECT_NE(st.status().message().find("--grad-clip"), std::string::npos);
  }
  RunConfig again = rc;
  again.resume = true;
  auto reopened = MakeEngine(specs, again, /*init_params=*/false);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ(reopened->engine->ResumedStep(), 1);
  auto s = States(*reopened->engine);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(BitIdentical(good_states, *s));
  SetLogSink(nullptr);
}

// By default the updates made before the late non-finite gradient are undone from their
// committed NVMe versions: the step is skipped whole and the run goes on.
TEST(EngineNumericsTest, LateNonFiniteGradientWithoutClippingIsUndoneFromNvme) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = ThreeBlockModel();
  TempDir dir;
  RunConfig rc = TightNvme(specs, dir.path(), 1, 0.0);
  auto f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(StepWithNan(*f, -1).ok());
  auto good = States(*f->engine);
  ASSERT_TRUE(good.ok());
  auto st = StepWithNan(*f, 0);  // block 0's gradient lands last
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->skipped);
  EXPECT_GT(st->redone_blocks, 0);  // updates ran before the NaN landed (as the test above)
  auto after = States(*f->engine);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(BitIdentical(*good, *after));
  ASSERT_TRUE(StepWithNan(*f, -1).ok());  // and the run goes on
  SetLogSink(nullptr);
}

}  // namespace
}  // namespace strata
