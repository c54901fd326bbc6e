// Int8 moments through the engine (StateFormat::kInt8): the moments' extents hold their codes
// and per-block scales (strata/state_layout.h) on every tier, so a run at the tightest NVMe
// budgets, and one resumed from its store, equal the unlimited run bit for bit; the planner
// counts the extents' bytes; written states read back dequantized and survive a resume.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "strata/bytes.h"
#include "strata/engine.h"
#include "strata/log.h"
#include "strata/state_layout.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

// The tightest NVMe budgets for int8 moments (the planner's minimums with them).
RunConfig TightInt8(const std::vector<BlockSpec>& specs, const std::string& dir, int mb,
                    double clip) {
  RunConfig rc;
  rc.state_format = StateFormat::kInt8;
  rc.micro_batches = mb;
  rc.grad_clip = clip;
  rc.nvme = dir;
  rc.host_mem = rc.device_mem = 1ull << 34;
  rc.durable = true;
  {
    auto f = MakeEngine(specs, rc, false);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return rc;
    rc.device_mem = f->engine->Placement().device_min_bytes;
  }
  auto f = MakeEngine(specs, rc, false);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (f.ok()) rc.host_mem = f->engine->Placement().host_min_bytes;
  return rc;
}

class EngineInt8StateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([](LogLevel, std::string_view) {});
  }
  void TearDown() override { SetLogSink(nullptr); }
};

TEST_F(EngineInt8StateTest, TightNvmeAndResumeMatchUnlimitedBitForBit) {
  const auto specs = ThreeBlockModel();
  for (double clip : {0.0, 0.05}) {
    SCOPED_TRACE("clip " + std::to_string(clip));
    RunConfig unlimited;
    unlimited.state_format = StateFormat::kInt8;
    unlimited.micro_batches = 2;
    unlimited.grad_clip = clip;
    auto ref = Train(specs, unlimited, 4);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    RunConfig fp32 = unlimited;
    fp32.state_format = StateFormat::kFp32;
    auto f32 = Train(specs, fp32, 4);
    ASSERT_TRUE(f32.ok());
    EXPECT_FALSE(BitIdentical(ref->states, f32->states));  // the moments are quantized
    // ... and close to fp32's: the master weights within a small part of their change.
    for (size_t k = 0; k < ref->states.size(); k += 3) {
      for (size_t i = 0; i < ref->states[k].size(); ++i) {
        ASSERT_NEAR(ref->states[k][i], f32->states[k][i], 0.02 + 0.02 * std::abs(f32->states[k][i]))
            << "block " << k / 3 << " element " << i;
      }
    }
    TempDir dir;
    const RunConfig tight = TightInt8(specs, dir.path(), 2, clip);
    {
      auto f = MakeEngine(specs, tight);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      ASSERT_TRUE(RunSteps(*f, 1, 2, 2, nullptr).ok());
    }
    RunConfig resumed = tight;
    resumed.resume = true;
    auto f = MakeEngine(specs, resumed);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ(f->engine->ResumedStep(), 2);
    ASSERT_TRUE(RunSteps(*f, 3, 4, 2, nullptr).ok());
    auto got = States(*f->engine);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(BitIdentical(ref->states, *got));
  }
}

// A store of int8 moments resumed with fp32 moments (and the reverse) is refused: its extents'
// lengths are not the ones the format needs.
TEST_F(EngineInt8StateTest, ResumeWithAnotherFormatIsRefused) {
  const auto specs = ThreeBlockModel();
  TempDir dir;
  RunConfig rc = TightInt8(specs, dir.path(), 1, 0);
  {
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE(RunSteps(*f, 1, 1, 1, nullptr).ok());
  }
  rc.resume = true;
  rc.host_mem = 1ull << 34;
  for (StateFormat other : {StateFormat::kFp32, StateFormat::kBf16}) {
    RunConfig wrong = rc;
    wrong.state_format = other;
    auto f = MakeEngine(specs, wrong);
    ASSERT_FALSE(f.ok()) << StateFormatName(other);
    // Refused for the format, by name, not for some other reason the changed config met.
    EXPECT_NE(f.status().message().find("int8"), std::string::npos) << f.status().ToString();
    EXPECT_NE(f.status().message().find(StateFormatName(other)), std::string::npos)
        << f.status().ToString();
  }
  auto f = MakeEngine(specs, rc);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
}

// The placement counts each moment extent as its codes and scales, and the NVMe traffic of a
// step with every state on NVMe is int8's share of fp32's: (4 + 2 + 8/2048) / 12 plus pages.
TEST_F(EngineInt8StateTest, PlannerCountsCodesAndScales) {
  const std::vector<BlockSpec> specs = {
      BlockSpec{"emb", {TensorSpec{"w", {1 << 16}, true}, TensorSpec{"b", {17}, false}}},
      BlockSpec{"h.0", {TensorSpec{"w", {3 << 15}, true}}}};
  PlacementReport rep[2];
  std::vector<BlockLayout> layout;
  for (int i = 0; i < 2; ++i) {
    TempDir dir;
    RunConfig rc;
    rc.state_format = i ? StateFormat::kInt8 : StateFormat::kFp32;
    rc.nvme = dir.path();
    rc.host_mem = rc.device_mem = 1ull << 34;
    rc.durable = true;
    auto f = MakeEngine(specs, rc, false);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    rep[i] = f->engine->Placement();
    layout = f->engine->Layout();
  }
  EXPECT_EQ(rep[1].state_format, StateFormat::kInt8);
  for (const ComponentPlacement& c : rep[1].components) {
    const BlockStateLayout st = DescribeBlockState(layout[c.block], 0, 1, {StateFormat::kInt8});
    if (const StateExtent* e = st.Extent(c.component)) {
      EXPECT_EQ(c.bytes, RoundUp(e->bytes, 4096)) << ComponentName(c.component);
    }
    if (c.component == Component::kExpAvg) {
      EXPECT_EQ(st.exp_avg.scales, c.block == 0 ? 32u + 1u : 48u);
    }
  }
  EXPECT_LT(rep[1].nvme_bytes, rep[0].nvme_bytes * 0.55);
  EXPECT_LT(rep[1].host_min_bytes, rep[0].host_min_bytes);
}

// Written int8 moments read back dequantized, written back to the same codes and scales, and
// survive a commit and a resume. (Written after steps they reach the next step: the
// optimizer-state test's StatesWrittenIntoAFreshEngineContinueTheRunBitForBit, int8 case.)
TEST_F(EngineInt8StateTest, WrittenMomentsReadBackAndSurviveAResume) {
  const auto specs = ThreeBlockModel();
  TempDir dir;
  RunConfig rc = TightInt8(specs, dir.path(), 1, 0);
  std::vector<std::vector<float>> want;
  {
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Engine& e = *f->engine;  // a fresh engine: CommitParams commits what is written as step 0
    for (int b = 0; b < int(specs.size()); ++b) {
      const uint64_t n = e.Layout()[b].shard_numel;
      for (Component c : {Component::kExpAvg, Component::kExpAvgSq}) {
        std::vector<float> x(n);
        for (uint64_t i = 0; i < n; ++i) {
          x[i] = c == Component::kExpAvg ? std::sin(float(i)) : 1e-4f * (1 + std::cos(float(i)));
        }
        ASSERT_TRUE(e.WriteComponent(b, c, x).ok());
        std::vector<float> got(n);
        ASSERT_TRUE(e.ReadComponent(b, c, got).ok());
        const auto& tensors = e.Layout()[b].tensors;
        for (const TensorLayout& t : tensors) {
          for (uint64_t i = t.offset; i < t.offset + t.numel; ++i) {
            // A code step, and below 2^-14 of the block's absmax (about 1 for exp_avg) 0.
            const double floor = c == Component::kExpAvg ? 7e-5 : 1e-9;
            ASSERT_NEAR(got[i], x[i], std::abs(x[i]) / 15 + floor) << b << " " << i;
          }
        }
        ASSERT_TRUE(e.WriteComponent(b, c, got).ok());
        std::vector<float> again(n);
        ASSERT_TRUE(e.ReadComponent(b, c, again).ok());
        EXPECT_EQ(again, got);
      }
    }
    const Status committed = e.CommitParams();
    ASSERT_TRUE(committed.ok()) << committed.ToString();
    auto s = States(e);
    ASSERT_TRUE(s.ok());
    want = *s;
  }
  rc.resume = true;
  auto f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto got = States(*f->engine);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(BitIdentical(*got, want));
}

// Every state on NVMe at fp32's tightest host budget: the NVMe bytes each step writes (the
// data of each extent, as the store counts them) are what the placement predicts, and
// int8 moments move at most 0.55 of fp32's at the same budget (4 + 2 bytes and the scales
// against 12 per parameter; the gradient does not touch NVMe here).
TEST_F(EngineInt8StateTest, MeasuredNvmeBytesEqualThePrediction) {
  const std::vector<BlockSpec> specs = {
      BlockSpec{"emb", {TensorSpec{"w", {1 << 16}, true}, TensorSpec{"b", {17}, false}}},
      BlockSpec{"h.0", {TensorSpec{"w", {3 << 15}, true}}},
      BlockSpec{"h.1", {TensorSpec{"w", {1 << 15}, true}}}};
  uint64_t moved[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const StateFormat fmt = i ? StateFormat::kInt8 : StateFormat::kFp32;
    SCOPED_TRACE(StateFormatName(fmt));
    TempDir dir;
    RunConfig rc = TightInt8(specs, dir.path(), 1, 0);
    rc.state_format = StateFormat::kFp32;  // both at fp32's minimum
    rc.pipeline = false;
    rc.host_mem = 1ull << 34;
    {
      auto probe = MakeEngine(specs, rc, false);
      ASSERT_TRUE(probe.ok()) << probe.status().ToString();
      rc.host_mem = probe->engine->Placement().host_min_bytes;
    }
    rc.state_format = fmt;
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const EdgeBytes want = f->engine->Placement().predicted_bytes;
    EXPECT_GT(want.nvme_write, 0u);
    for (int64_t step = 1; step <= 4; ++step) {
      ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
      ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, step, 0).ok());
      auto st = f->engine->EndStep();
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      if (step <= 2) continue;  // the first steps start from the initial commit's cache
      // (Reads depend on what the step before left in the cache, which the prediction, made
      // from an empty cache, does not know: fp32 here reads 1.8 or 2.4 MB by step.)
      EXPECT_EQ(st->bytes.nvme_write, want.nvme_write) << "step " << step;
      moved[i] += st->bytes.nvme_read + st->bytes.nvme_write;
    }
  }
  EXPECT_LE(double(moved[1]), 0.55 * double(moved[0])) << moved[1] << " vs " << moved[0];
}

// A resume that changes the moments' format converts them with convert_state_format: fp32 ->
// int8 gives the quantized fp32 moments (the master weights untouched), int8 -> fp32 the
// dequantized ones exactly; the converted states commit with the next step, after which the
// store resumes in its new format without the option.
TEST_F(EngineInt8StateTest, ResumeConvertsTheMomentsWhenAsked) {
  const auto specs = ThreeBlockModel();
  for (auto [from, to] : {std::pair{StateFormat::kFp32, StateFormat::kInt8},
                          std::pair{StateFormat::kInt8, StateFormat::kFp32},
                          std::pair{StateFormat::kBf16, StateFormat::kInt8}}) {
    SCOPED_TRACE(std::string(StateFormatName(from)) + " -> " + StateFormatName(to));
    TempDir dir;
    RunConfig rc = TightInt8(specs, dir.path(), 1, 0);
    rc.state_format = StateFormat::kFp32;  // the larger format's minimum: NVMe homes
    rc.host_mem = 1ull << 34;
    {
      auto probe = MakeEngine(specs, rc, false);
      ASSERT_TRUE(probe.ok()) << probe.status().ToString();
      rc.host_mem = probe->engine->Placement().host_min_bytes;
    }
    rc.state_format = from;
    std::vector<std::vector<float>> before;
    {
      auto f = MakeEngine(specs, rc);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      ASSERT_TRUE(RunSteps(*f, 1, 2, 1, nullptr).ok());
      auto s = States(*f->engine);
      ASSERT_TRUE(s.ok());
      before = *s;
    }
    rc.resume = true;
    rc.state_format = to;
    EXPECT_FALSE(MakeEngine(specs, rc).ok());  // refused without the option
    rc.convert_state_format = true;
    {
      auto f = MakeEngine(specs, rc);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      EXPECT_EQ(f->engine->ResumedStep(), 2);
      auto got = States(*f->engine);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t k = 0; k < before.size(); ++k) {
        const int b = int(k / 3);
        std::vector<float> want = before[k];
        if (k % 3 != 0) {  // a moment: as the new format stores it
          const Component c = k % 3 == 1 ? Component::kExpAvg : Component::kExpAvgSq;
          const BlockStateLayout st =
              DescribeBlockState(f->engine->Layout()[b], 0, 1, StateFormats{to});
          std::vector<uint8_t> bytes(st.Extent(c)->bytes);
          ASSERT_TRUE(EncodeMoment(st, c, before[k], bytes).ok());
          ASSERT_TRUE(DecodeMoment(st, c, bytes, want).ok());
        }
        EXPECT_EQ((*got)[k], want) << "block " << b << " component " << k % 3;
      }
      ASSERT_TRUE(RunSteps(*f, 3, 3, 1, nullptr).ok());
    }
    rc.convert_state_format = false;
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->engine->ResumedStep(), 3);
  }
}

}  // namespace
}  // namespace strata
