// A bf16 master through the engine (EngineOptions::master_format kBf16Stochastic): the master
// extent holds shard_numel bf16 values on every tier and is the device's params; its
// stochastic rounding is keyed by step, block and element, so a run at the tightest NVMe
// budgets, and one resumed from its store, equal the unlimited run bit for bit; the planner
// counts 2 bytes per parameter and predicts the NVMe bytes each step moves; a store of one
// master format is refused by name under the other.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

constexpr MasterFormat kBf16 = MasterFormat::kBf16Stochastic;

RunConfig Bf16Master(StateFormat moments) {
  RunConfig rc;
  rc.dtype = WorkingDtype::kBf16;
  rc.master_format = kBf16;
  rc.state_format = moments;
  return rc;
}

// `rc` at the planner's tightest budgets, every state on NVMe, durable.
RunConfig Tight(const std::vector<BlockSpec>& specs, RunConfig rc, const std::string& dir) {
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

bool AllBf16(const std::vector<float>& v) {
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if ((bits & 0xffff) != 0) return false;
  }
  return true;
}

class EngineBf16MasterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([](LogLevel, std::string_view) {});
  }
  void TearDown() override { SetLogSink(nullptr); }
};

// The master stays bf16 (every value read back is a widened bf16), moves away from its start,
// and stays close to the fp32 master's run; tight NVMe budgets and a resume after a commit give
// the unlimited run's bits.
TEST_F(EngineBf16MasterTest, TrainsAndTightNvmeAndResumeMatchUnlimitedBitForBit) {
  const auto specs = ThreeBlockModel();
  for (StateFormat moments : {StateFormat::kInt8, StateFormat::kFp32}) {
    for (double clip : {0.0, 0.05}) {
      SCOPED_TRACE(std::string(StateFormatName(moments)) + " clip " + std::to_string(clip));
      RunConfig unlimited = Bf16Master(moments);
      unlimited.micro_batches = 2;
      unlimited.grad_clip = clip;
      auto ref = Train(specs, unlimited, 4);
      ASSERT_TRUE(ref.ok()) << ref.status().ToString();
      RunConfig fp32 = unlimited;
      fp32.master_format = MasterFormat::kFp32;
      auto f32 = Train(specs, fp32, 4);
      ASSERT_TRUE(f32.ok()) << f32.status().ToString();
      for (size_t k = 0; k < ref->states.size(); k += 3) {
        EXPECT_TRUE(AllBf16(ref->states[k])) << "block " << k / 3;
        EXPECT_FALSE(AllBf16(f32->states[k])) << "block " << k / 3;
        for (size_t i = 0; i < ref->states[k].size(); ++i) {
          // A few bf16 ulps (2^-8 relative) of the weight, and of the 4 steps' lr 0.01.
          ASSERT_NEAR(ref->states[k][i], f32->states[k][i],
                      0.02 + 0.02 * std::abs(f32->states[k][i]))
              << "block " << k / 3 << " element " << i;
        }
      }
      TempDir dir;
      RunConfig tight = Tight(specs, unlimited, dir.path());
      {
        auto f = MakeEngine(specs, tight);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        auto init = States(*f->engine);
        ASSERT_TRUE(init.ok());
        ASSERT_TRUE(RunSteps(*f, 1, 2, 2, nullptr).ok());
        auto two = States(*f->engine);
        ASSERT_TRUE(two.ok());
        EXPECT_NE((*init)[3], (*two)[3]);  // the master moved
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
}

// The planner counts the master as 2 bytes per parameter, with no separate param copy.
TEST_F(EngineBf16MasterTest, PlannerCountsTwoBytesAndNoParamCopy) {
  const std::vector<BlockSpec> specs = {
      BlockSpec{"emb", {TensorSpec{"w", {1 << 16}, true}, TensorSpec{"b", {17}, false}}},
      BlockSpec{"h.0", {TensorSpec{"w", {3 << 15}, true}}}};
  PlacementReport rep[2];
  std::vector<BlockLayout> layout;
  for (int i = 0; i < 2; ++i) {
    TempDir dir;
    RunConfig rc = Bf16Master(StateFormat::kInt8);
    if (i == 0) rc.master_format = MasterFormat::kFp32;
    rc.nvme = dir.path();
    rc.host_mem = rc.device_mem = 1ull << 34;
    rc.durable = true;
    auto f = MakeEngine(specs, rc, false);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    rep[i] = f->engine->Placement();
    layout = f->engine->Layout();
  }
  EXPECT_EQ(rep[1].master_format, kBf16);
  bool saw_master = false;
  for (const ComponentPlacement& c : rep[1].components) {
    EXPECT_NE(c.component, Component::kParam) << "block " << c.block;
    if (c.component == Component::kMaster) {
      saw_master = true;
      EXPECT_EQ(c.bytes, RoundUp(layout[c.block].shard_numel * 2, 4096));
    }
  }
  EXPECT_TRUE(saw_master);
  // fp32 master + bf16 param copy (6 bytes) against the bf16 master (2), moments alike.
  EXPECT_LT(rep[1].nvme_bytes, rep[0].nvme_bytes * 0.6);
  EXPECT_LT(rep[1].host_min_bytes, rep[0].host_min_bytes);
  EXPECT_DOUBLE_EQ(StateBytesPerParam({StateFormat::kInt8, kBf16}), 4.0 + 8.0 / 2048);
  EXPECT_DOUBLE_EQ(StateBytesPerParam({StateFormat::kFp32, kBf16}), 10.0);
}

// Every state on NVMe at the fp32 run's tightest host budget: the bytes each step writes are
// what the placement predicts, and int8 moments with a bf16 master move at most 0.36 of the
// fp32 states' bytes (4 + 1/256 against 12 per parameter each way; 14 with bf16 params).
TEST_F(EngineBf16MasterTest, MeasuredNvmeBytesEqualThePrediction) {
  const std::vector<BlockSpec> specs = {
      BlockSpec{"emb", {TensorSpec{"w", {1 << 16}, true}, TensorSpec{"b", {17}, false}}},
      BlockSpec{"h.0", {TensorSpec{"w", {3 << 15}, true}}},
      BlockSpec{"h.1", {TensorSpec{"w", {1 << 15}, true}}}};
  RunConfig cases[3];
  cases[0].dtype = WorkingDtype::kFp32;  // fp32 states, fp32 params: 12 bytes
  cases[1] = cases[0];
  cases[1].dtype = WorkingDtype::kBf16;  // fp32 states and a bf16 param copy: 14
  cases[2] = Bf16Master(StateFormat::kInt8);
  uint64_t moved[3] = {0, 0, 0};
  TempDir probe_dir;
  const RunConfig base = Tight(specs, cases[1], probe_dir.path());
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    TempDir dir;
    RunConfig rc = cases[i];
    rc.nvme = dir.path();
    rc.durable = true;
    rc.pipeline = false;
    rc.device_mem = 1ull << 34;
    rc.host_mem = base.host_mem;  // every case at the largest one's minimum
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
      EXPECT_EQ(st->bytes.nvme_write, want.nvme_write) << "step " << step;
      moved[i] += st->bytes.nvme_read + st->bytes.nvme_write;
    }
  }
  EXPECT_LE(double(moved[2]), 0.36 * double(moved[0])) << moved[2] << " vs " << moved[0];
  EXPECT_LE(double(moved[2]), 0.36 * double(moved[1])) << moved[2] << " vs " << moved[1];
}

// A store written with one master format is refused by name under the other.
TEST_F(EngineBf16MasterTest, ResumeWithAnotherMasterFormatIsRefused) {
  const auto specs = ThreeBlockModel();
  for (MasterFormat written : {kBf16, MasterFormat::kFp32}) {
    SCOPED_TRACE(MasterFormatName(written));
    TempDir dir;
    RunConfig rc = Bf16Master(StateFormat::kInt8);
    rc.master_format = written;
    rc = Tight(specs, rc, dir.path());
    {
      auto f = MakeEngine(specs, rc);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      ASSERT_TRUE(RunSteps(*f, 1, 1, 1, nullptr).ok());
    }
    rc.resume = true;
    rc.host_mem = 1ull << 34;
    RunConfig wrong = rc;
    wrong.master_format = written == kBf16 ? MasterFormat::kFp32 : kBf16;
    wrong.convert_state_format = true;  // converts moments, never the master
    auto bad = MakeEngine(specs, wrong);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find(MasterFormatName(written)), std::string::npos)
        << bad.status().ToString();
    auto f = MakeEngine(specs, rc);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
  }
}

// The options: an fp32 working dtype is refused, Kahan is NotSupported by name, and kAuto
// resolves to bf16 on a HostDevice.
TEST_F(EngineBf16MasterTest, OptionsAreCheckedByName) {
  const auto specs = ThreeBlockModel();
  RunConfig rc = Bf16Master(StateFormat::kFp32);
  rc.dtype = WorkingDtype::kFp32;
  auto f = MakeEngine(specs, rc, false);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  rc.dtype = WorkingDtype::kBf16;
  rc.master_format = MasterFormat::kBf16Kahan;
  f = MakeEngine(specs, rc, false);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(f.status().message().find("bf16-kahan"), std::string::npos);
  rc.dtype = WorkingDtype::kAuto;
  rc.master_format = kBf16;
  f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->engine->Placement().dtype, WorkingDtype::kBf16);
}

}  // namespace
}  // namespace strata
