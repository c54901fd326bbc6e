// The optimizer's state from outside a step: Engine::WriteComponent (moments and master weights
// written between steps, as torch's optimizer.load_state_dict needs), StepArgs::step_offset
// (the bias correction's step count of moments loaded from another run) and StepArgs::groups
// (per-tensor optimizer groups: torch's param_groups). Each is checked bit for bit against a
// run that never left the engine, or against AdamStep by hand, on a HostDevice, with unlimited
// budgets and with the tightest NVMe budgets (where the updates are deferred to the next step).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/log.h"
#include "strata/optim.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

// Tensors in two optimizer groups; "b" and "ln" without weight decay.
std::vector<BlockSpec> GroupedModel() {
  auto t = [](std::string name, std::vector<int64_t> shape, bool wd, int group) {
    TensorSpec s{std::move(name), std::move(shape), wd};
    s.group = group;
    return s;
  };
  return {BlockSpec{"emb", {t("w", {1023, 3}, true, 0), t("b", {17}, false, 1)}},
          BlockSpec{"h.0", {t("w", {4096, 2}, true, 1)}},
          BlockSpec{"h.1", {t("w", {15, 15}, true, 0), t("ln", {1}, false, 1)}}};
}

// Step s's groups: their lr changes every step, as a scheduler's would.
std::vector<OptimizerGroup> Groups(int64_t s) {
  return {
      OptimizerGroup{
          .lr = 0.01 / double(s), .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1},
      OptimizerGroup{
          .lr = 0.003 * double(s), .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.05}};
}

// Runs steps first..last of the fake model with Groups(step) (none when !grouped).
Status Steps(Fixture& f, int64_t first, int64_t last, int mb, bool grouped,
             int64_t step_offset = 0) {
  for (int64_t step = first; step <= last; ++step) {
    StepArgs args{.lr = 0.01, .grad_scale = 0.5};
    if (grouped) args.groups = Groups(step);
    args.step_offset = step_offset;
    STRATA_RETURN_IF_ERROR(f.engine->BeginStep(args));
    for (int m = 0; m < mb; ++m) {
      STRATA_RETURN_IF_ERROR(testing::RunFakeMicroBatch(*f.engine, *f.device, step, m));
    }
    STRATA_RETURN_IF_ERROR(f.engine->EndStep().status());
  }
  return Status::OK();
}

// The tightest budgets with NVMe, asked of the planner (pipelined updates with clipping).
RunConfig Tight(const std::vector<BlockSpec>& specs, const std::string& dir, RunConfig rc) {
  rc.nvme = dir;
  rc.durable = true;
  rc.host_mem = rc.device_mem = 1ull << 34;
  auto probe = MakeEngine(specs, rc, /*init_params=*/false);
  EXPECT_TRUE(probe.ok()) << probe.status().ToString();
  rc.device_mem = probe->engine->Placement().device_min_bytes;
  probe->engine.reset();
  probe = MakeEngine(specs, rc, /*init_params=*/false);
  EXPECT_TRUE(probe.ok()) << probe.status().ToString();
  rc.host_mem = probe->engine->Placement().host_min_bytes;
  return rc;
}

TEST(EngineGroupsTest, EachTensorIsUpdatedWithItsGroupsSettingsAsAdamStepByHand) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = GroupedModel();
  const int mb = 2, steps = 3;
  // A clip the norm never reaches: the updates wait for it (deferred to the next step under
  // the tight budgets) and the scale stays grad_scale.
  RunConfig unlimited;
  unlimited.micro_batches = mb;
  unlimited.grad_clip = 1e30;
  TempDir dir;
  for (const RunConfig& rc : {unlimited, Tight(specs, dir.path(), unlimited)}) {
    SCOPED_TRACE(rc.nvme.empty() ? "unlimited" : "tight NVMe");
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE(Steps(*f, 1, steps, mb, /*grouped=*/true).ok());
    for (int b = 0; b < int(specs.size()); ++b) {
      const BlockLayout& bl = f->engine->Layout()[b];
      std::vector<float> p(bl.padded_numel, 0), m(p.size(), 0), v(p.size(), 0), g(p.size());
      for (size_t t = 0; t < bl.tensors.size(); ++t) {
        for (uint64_t i = 0; i < bl.tensors[t].numel; ++i) {
          p[bl.tensors[t].offset + i] = testing::InitValue(b, int(t), i);
        }
      }
      for (int64_t s = 1; s <= steps; ++s) {
        const BlockView view{b, p.data(), WorkingDtype::kFp32, &bl};
        std::fill(g.begin(), g.end(), 0.f);
        for (int mi = 0; mi < mb; ++mi) {
          for (uint64_t k = 0; k < g.size(); ++k) g[k] += testing::FakeGrad(view, k, s, mi);
        }
        for (const TensorLayout& t : bl.tensors) {
          const OptimizerGroup grp = Groups(s)[t.group];
          AdamSlice sl{p.data() + t.offset, m.data() + t.offset,
                       v.data() + t.offset, g.data() + t.offset,
                       FloatFormat::kFp32,  nullptr,
                       ParamOut::kNone,     t.numel};
          AdamHyperParams hp;
          hp.lr = grp.lr;
          hp.beta1 = grp.beta1;
          hp.beta2 = grp.beta2;
          hp.eps = grp.eps;
          hp.weight_decay = t.weight_decay ? grp.weight_decay : 0.0;
          hp.step = s;
          ASSERT_TRUE(AdamStep(sl, hp, 0.5f).ok());
        }
      }
      std::vector<float> got(bl.shard_numel);
      for (const auto& [c, want] :
           {std::pair{Component::kMaster, &p}, std::pair{Component::kExpAvg, &m},
            std::pair{Component::kExpAvgSq, &v}}) {
        ASSERT_TRUE(f->engine->ReadComponent(b, c, got).ok());
        for (const TensorLayout& t : bl.tensors) {
          EXPECT_EQ(0, std::memcmp(got.data() + t.offset, want->data() + t.offset,
                                   t.numel * sizeof(float)))
              << bl.name << "." << t.name << " " << ComponentName(c);
        }
      }
    }
  }
  SetLogSink(nullptr);
}

TEST(EngineGroupsTest, BadGroupsAreRefusedNamingTheTensorOrTheValue) {
  const auto specs = GroupedModel();
  auto f = MakeEngine(specs, RunConfig{});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  StepArgs one{.lr = 0.01};
  one.groups = {OptimizerGroup{}};
  Status s = f->engine->BeginStep(one);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'emb.b' is in optimizer group 1"), std::string::npos)
      << s.ToString();
  StepArgs bad{.lr = 0.01};
  bad.groups = Groups(1);
  bad.groups[1].beta2 = 1.0;
  s = f->engine->BeginStep(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("optimizer group 1 out of range"), std::string::npos) << s.ToString();
  StepArgs early{.lr = 0.01};
  early.step_offset = -1;
  EXPECT_EQ(f->engine->BeginStep(early).code(), StatusCode::kInvalidArgument);
  // Without groups every tensor takes the step's lr and the options' settings, whatever its
  // group says.
  EXPECT_TRUE(Steps(*f, 1, 1, 1, /*grouped=*/false).ok());
}

// Every master weight and moment of the engine, block by block, and random ones of the same
// sizes.
std::vector<std::vector<float>> RandomStates(const Engine& e, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> out;
  for (const BlockLayout& bl : e.Layout()) {
    for (int c = 0; c < 3; ++c) {
      std::vector<float> v(bl.shard_numel);
      for (float& x : v) x = c == 2 ? std::abs(normal(rng)) * 1e-3f : normal(rng);
      out.push_back(std::move(v));
    }
  }
  return out;
}

constexpr Component kStates[] = {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq};

Status WriteStates(Engine& e, const std::vector<std::vector<float>>& states) {
  for (size_t i = 0; i < states.size(); ++i) {
    STRATA_RETURN_IF_ERROR(e.WriteComponent(int(i / 3), kStates[i % 3], states[i]));
  }
  return Status::OK();
}

// What the engine stores of `states`: bf16 moments rounded to nearest even.
std::vector<std::vector<float>> Stored(std::vector<std::vector<float>> states, StateFormat fmt) {
  if (fmt == StateFormat::kBf16) {
    for (size_t i = 0; i < states.size(); ++i) {
      if (i % 3 == 0) continue;
      for (float& x : states[i]) x = Bf16ToFloat(FloatToBf16(x));
    }
  }
  return states;
}

// Written states read back (bf16 moments as rounded to nearest even), a value read back is
// written back exactly, and the next step starts from them on every tier: its commit holds
// them (a resume sees the same states), and the result does not depend on the budgets. Written
// into a fresh engine, CommitParams commits them as step 0.
TEST(EngineWriteComponentTest, WrittenStatesReadBackAndSurviveACommitAndAResume) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = GroupedModel();
  for (StateFormat fmt : {StateFormat::kFp32, StateFormat::kBf16}) {
    SCOPED_TRACE(StateFormatName(fmt));
    RunConfig base;
    base.state_format = fmt;
    TempDir dir;
    const RunConfig tight = Tight(specs, dir.path(), base);
    std::vector<std::vector<float>> after_step2[2];
    for (int i = 0; i < 2; ++i) {
      const RunConfig& rc = i == 0 ? base : tight;
      SCOPED_TRACE(rc.nvme.empty() ? "unlimited" : "tight NVMe");
      {
        auto f = MakeEngine(specs, rc);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        ASSERT_TRUE(Steps(*f, 1, 1, 1, false).ok());  // states on every tier
        const auto states = RandomStates(*f->engine, 7);
        const auto want = Stored(states, fmt);
        ASSERT_TRUE(WriteStates(*f->engine, states).ok());
        auto got = States(*f->engine);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_TRUE(BitIdentical(*got, want));
        ASSERT_TRUE(WriteStates(*f->engine, *got).ok());  // a bf16 widened: exactly
        got = States(*f->engine);
        ASSERT_TRUE(got.ok());
        EXPECT_TRUE(BitIdentical(*got, want));
        ASSERT_TRUE(Steps(*f, 2, 2, 1, false).ok());
        auto at2 = States(*f->engine);
        ASSERT_TRUE(at2.ok());
        after_step2[i] = *at2;
      }
      if (i == 0) continue;
      EXPECT_TRUE(BitIdentical(after_step2[0], after_step2[1]));
      RunConfig again = rc;
      again.resume = true;
      auto f = MakeEngine(specs, again);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      EXPECT_EQ(f->engine->ResumedStep(), 2);
      auto got = States(*f->engine);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(BitIdentical(*got, after_step2[1]));
    }
    TempDir fresh_dir;
    RunConfig fresh = Tight(specs, fresh_dir.path(), base);
    std::vector<std::vector<float>> want;
    {
      auto f = MakeEngine(specs, fresh);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      const auto states = RandomStates(*f->engine, 8);
      want = Stored(states, fmt);
      ASSERT_TRUE(WriteStates(*f->engine, states).ok());
      ASSERT_TRUE(f->engine->CommitParams().ok());
    }
    fresh.resume = true;
    auto f = MakeEngine(specs, fresh);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->engine->ResumedStep(), 0);
    auto got = States(*f->engine);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(BitIdentical(*got, want));
  }
  SetLogSink(nullptr);
}

// A run's states after step 2, written into a fresh engine whose step count starts at 0, with
// step_offset 2: its step 3 equals the uninterrupted run's, bit for bit (stochastic bf16
// rounding included: it is keyed by the bias correction's step; int8 moments read back
// dequantized encode to the same codes and scales again; with a bf16 working copy the
// master weights written reach the copy the device computes with).
TEST(EngineWriteComponentTest, StatesWrittenIntoAFreshEngineContinueTheRunBitForBit) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = GroupedModel();
  for (const auto& [fmt, dtype] : {std::pair{StateFormat::kFp32, WorkingDtype::kFp32},
                                   std::pair{StateFormat::kBf16, WorkingDtype::kFp32},
                                   std::pair{StateFormat::kInt8, WorkingDtype::kFp32},
                                   std::pair{StateFormat::kFp32, WorkingDtype::kBf16}}) {
    SCOPED_TRACE(std::string(StateFormatName(fmt)) + " moments, " + WorkingDtypeName(dtype) +
                 " working copy");
    RunConfig rc;
    rc.state_format = fmt;
    rc.dtype = dtype;
    rc.micro_batches = 2;
    rc.grad_clip = 1e30;
    auto a = MakeEngine(specs, rc);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(Steps(*a, 1, 2, 2, true).ok());
    auto at2 = States(*a->engine);
    ASSERT_TRUE(at2.ok());
    ASSERT_TRUE(Steps(*a, 3, 3, 2, true).ok());
    auto at3 = States(*a->engine);
    ASSERT_TRUE(at3.ok());
    TempDir dir;
    auto b = MakeEngine(specs, Tight(specs, dir.path(), rc));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE(WriteStates(*b->engine, *at2).ok());
    ASSERT_TRUE(Steps(*b, 3, 3, 2, true, /*step_offset=*/2).ok());
    auto got = States(*b->engine);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(BitIdentical(*got, *at3));
    EXPECT_EQ(b->engine->ResumedStep(), 0);  // the commits count the engine's own steps
  }
  SetLogSink(nullptr);
}

// The store's commits only go forward: a step_offset that would commit at or below the
// committed step is refused by BeginStep, naming both counts, and the engine goes on.
TEST(EngineWriteComponentTest, AStepOffsetThatCountsBackIsRefusedBeforeTheStep) {
  SetLogSink([](LogLevel, std::string_view) {});
  const auto specs = GroupedModel();
  TempDir dir;
  RunConfig rc;
  rc.grad_clip = 1e30;
  auto f = MakeEngine(specs, Tight(specs, dir.path(), rc));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(Steps(*f, 1, 3, 1, true).ok());
  auto before = States(*f->engine);
  ASSERT_TRUE(before.ok());
  StepArgs back{.lr = 0.01};
  back.step_offset = -3;  // would commit as step 1, under the committed 3
  Status s = f->engine->BeginStep(back);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("would commit as step 1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("committed step 3"), std::string::npos) << s.ToString();
  back.step_offset = -1;  // step 3 again: refused too
  EXPECT_EQ(f->engine->BeginStep(back).code(), StatusCode::kInvalidArgument);
  auto after = States(*f->engine);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(BitIdentical(*after, *before));
  EXPECT_TRUE(Steps(*f, 4, 4, 1, true).ok());  // the engine goes on
  SetLogSink(nullptr);
}

TEST(EngineWriteComponentTest, WrongComponentSizeOrTimeIsRefused) {
  const auto specs = GroupedModel();
  auto f = MakeEngine(specs, RunConfig{});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Engine& e = *f->engine;
  const uint64_t n = e.Layout()[1].shard_numel;
  std::vector<float> right(n, 1.f), short_(n - 1, 1.f), long_(n + 1, 1.f);
  for (Component c : {Component::kGrad, Component::kParam}) {
    Status s = e.WriteComponent(1, c, right);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << ComponentName(c);
    EXPECT_NE(s.message().find(ComponentName(c)), std::string::npos) << s.ToString();
  }
  for (const auto* v : {&short_, &long_}) {
    Status s = e.WriteComponent(1, Component::kExpAvg, *v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("block 'h.0' has " + std::to_string(n)), std::string::npos)
        << s.ToString();
  }
  EXPECT_EQ(e.WriteComponent(3, Component::kExpAvg, right).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.BeginStep(StepArgs{}).ok());
  EXPECT_EQ(e.WriteComponent(1, Component::kExpAvg, right).code(), StatusCode::kInvalidArgument);
  // Nothing was written: the moments are still zero.
  ASSERT_TRUE(testing::RunFakeMicroBatch(e, *f->device, 1, 0).ok());
  ASSERT_TRUE(e.EndStep().ok());
  std::vector<float> m(n);
  ASSERT_TRUE(e.ReadComponent(1, Component::kExpAvg, m).ok());
  EXPECT_LT(std::abs(m[0]), 0.5f);
}

}  // namespace
}  // namespace strata
