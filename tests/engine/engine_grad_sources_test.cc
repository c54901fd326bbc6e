// Engine::SubmitGradsFrom: the gradient read from the model's own memory (as the Python layer
// hands torch's tensors) instead of the GradBuffer. Over random models, budgets (device and
// host at their minimum or roomy, NVMe), micro-batch counts and clipping, the states equal the
// GradBuffer path's bit for bit; the model's memory is overwritten with NaN as soon as
// GradsRead() says it was read, so a late read would show; a null source is a zero gradient;
// bad calls are clear errors that leave the step usable.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/log.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

void RandomTrial(uint64_t seed, int trial) {
  std::mt19937_64 rng(seed + uint64_t(trial));
  SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) +
               " (replay: STRATA_TEST_SEED=" + std::to_string(seed) +
               " STRATA_TEST_TRIAL=" + std::to_string(trial) + ")");
  const int L = 1 + int(rng() % 4);
  const std::vector<BlockSpec> specs = RandomModel(rng, L);
  TempDir dir;
  RunConfig rc;
  rc.micro_batches = 1 + int(rng() % 3);
  rc.grad_clip = rng() % 2 ? 0.0 : 0.05;
  rc.nvme = rng() % 2 ? dir.path() : "";
  // The minimums, asked of an engine with roomy budgets. A huge host budget, not an unlimited
  // one: with NVMe and no host budget the planner reports the all-on-host minimum, which for
  // a small model can be below the NVMe path's minimum that a finite budget takes (seed
  // 1022442055 trial 5 drew one).
  RunConfig roomy = rc;
  roomy.host_mem = uint64_t{1} << 34;
  auto probe = MakeEngine(specs, roomy, /*init_params=*/false);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  const PlacementReport mins = probe->engine->Placement();
  probe->engine.reset();
  rc.device_mem = rng() % 2 ? mins.device_min_bytes : 0;
  if (!rc.nvme.empty() && rng() % 2) {
    // The host minimum depends on the device budget (a tighter device copies a block's params
    // again in backward, from the host cache): asked again with the one chosen (seed
    // 2604248467 trial 7 drew a host minimum 8 KiB above the unlimited device's).
    RunConfig at = roomy;
    at.device_mem = rc.device_mem;
    auto again = MakeEngine(specs, at, /*init_params=*/false);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    rc.host_mem = again->engine->Placement().host_min_bytes;
  }
  const bool zero_last = rng() % 3 == 0;
  SCOPED_TRACE("L=" + std::to_string(L) + " mb=" + std::to_string(rc.micro_batches) + " clip=" +
               std::to_string(rc.grad_clip) + " nvme=" + std::to_string(!rc.nvme.empty()) +
               " device=" + std::to_string(rc.device_mem) + " host=" + std::to_string(rc.host_mem) +
               " zero_last=" + std::to_string(zero_last));
  const int steps = 3;
  auto buffered = Train(specs, rc, steps, /*from_caller=*/false, zero_last);
  ASSERT_TRUE(buffered.ok()) << buffered.status().ToString();
  TempDir dir2;
  RunConfig rc2 = rc;
  if (!rc.nvme.empty()) rc2.nvme = dir2.path();
  auto caller = Train(specs, rc2, steps, /*from_caller=*/true, zero_last);
  ASSERT_TRUE(caller.ok()) << caller.status().ToString();
  EXPECT_TRUE(BitIdentical(buffered->states, caller->states));
  EXPECT_EQ(buffered->rec.norms, caller->rec.norms);
  if (rc.device_mem != 0) {
    EXPECT_LE(caller->rec.peak_device, rc.device_mem);
  }
  if (rc.host_mem != 0) {
    EXPECT_LE(caller->rec.peak_host, rc.host_mem);
  }
  EXPECT_GE(caller->max_caller_held, 1u);
}

TEST(EngineGradSourcesTest, RandomModelsAndBudgetsMatchTheGradBufferBitForBit) {
  SetLogSink([](LogLevel, std::string_view) {});
  const char* env_seed = std::getenv("STRATA_TEST_SEED");
  const uint64_t seed = env_seed ? std::strtoull(env_seed, nullptr, 10) : std::random_device{}();
  const char* env_trial = std::getenv("STRATA_TEST_TRIAL");
  for (int trial = 0; trial < 8 && !HasFailure(); ++trial) {
    if (env_trial && trial != std::atoi(env_trial)) continue;
    RandomTrial(seed, trial);
  }
  SetLogSink(nullptr);
}

// A null source is a zero gradient: the same states as a GradBuffer whose last tensor the
// model filled with zeros, and different from a run where it carries its gradient.
TEST(EngineGradSourcesTest, NullSourceIsAZeroGradient) {
  const std::vector<BlockSpec> specs = {
      BlockSpec{"h.0", {TensorSpec{"w", {31, 5}, true}, TensorSpec{"b", {7}, false}}}};
  RunConfig rc;
  auto zero_buf = Train(specs, rc, 2, /*from_caller=*/false, /*zero_last=*/true);
  auto null_src = Train(specs, rc, 2, /*from_caller=*/true, /*zero_last=*/true);
  auto full = Train(specs, rc, 2, /*from_caller=*/true, /*zero_last=*/false);
  ASSERT_TRUE(zero_buf.ok() && null_src.ok() && full.ok());
  EXPECT_TRUE(BitIdentical(zero_buf->states, null_src->states));
  EXPECT_FALSE(BitIdentical(full->states, null_src->states));
}

TEST(EngineGradSourcesTest, BadCallsAreClearErrorsAndTheStepGoesOn) {
  const std::vector<BlockSpec> specs = {
      BlockSpec{"h.0", {TensorSpec{"w", {8, 4}, true}, TensorSpec{"b", {4}, false}}},
      BlockSpec{"h.1", {TensorSpec{"w", {8, 4}, true}}}};
  auto f = MakeEngine(specs, RunConfig{});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Engine& e = *f->engine;
  std::vector<float> w(32, 0.5f), b(4, 0.25f);
  const std::vector<const float*> two = {w.data(), b.data()};
  ASSERT_TRUE(e.BeginStep(StepArgs{.lr = 0.01}).ok());
  for (int blk = 0; blk < 2; ++blk) {
    ASSERT_TRUE(e.Acquire(blk, Pass::kForward).ok());
    // Not acquired for backward.
    auto early = e.SubmitGradsFrom(blk, blk == 0 ? two : std::vector<const float*>{w.data()});
    EXPECT_EQ(early.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(early.status().message().find("acquired for backward"), std::string::npos)
        << early.status().ToString();
    ASSERT_TRUE(e.Release(blk).ok());
  }
  ASSERT_TRUE(e.Acquire(1, Pass::kBackward).ok());
  // Wrong number of tensors: names what the block has.
  auto wrong = e.SubmitGradsFrom(1, two);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("has 1 tensors"), std::string::npos)
      << wrong.status().ToString();
  auto t1 = e.SubmitGradsFrom(1, std::vector<const float*>{w.data()});
  ASSERT_TRUE(t1.ok()) << t1.status().ToString();
  // Twice for one access.
  EXPECT_EQ(e.SubmitGradsFrom(1, std::vector<const float*>{w.data()}).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.Release(1).ok());
  ASSERT_TRUE(e.Acquire(0, Pass::kBackward).ok());
  auto t2 = e.SubmitGradsFrom(0, two);
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  EXPECT_EQ(*t2, *t1 + 1);
  ASSERT_TRUE(e.Release(0).ok());
  auto st = e.EndStep();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(e.GradsRead(), *t2);
  // The norm is that of the gradients given: 32 x 0.5 and 4 x 0.25 (block 1 read w too).
  EXPECT_NEAR(st->grad_norm, std::sqrt(2 * 32 * 0.25 + 4 * 0.0625), 1e-6);
}

}  // namespace
}  // namespace strata
