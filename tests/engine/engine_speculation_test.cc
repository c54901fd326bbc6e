// The speculative optimizer (EngineOptions::speculation) and gradients on NVMe
// (EngineOptions::grad_spill): with clipping, updates that run before the global norm and are
// redone (or undone) at EndStep give the states of updates that wait for the norm, bit for
// bit, over random models, budgets, micro-batch counts and clipping thresholds that clip on
// some steps and not on others; a non-finite gradient skips the step whole; a failing drive
// during a redo is a clear error and the last commit stays resumable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "strata/engine.h"
#include "strata/fault_injection.h"
#include "strata/log.h"
#include "tests/engine/engine_harness.h"
#include "tests/engine/fake_model.h"

namespace strata {
namespace {

using namespace engine_test;  // NOLINT: the harness is this test's vocabulary

// The clipping threshold between the smallest and the largest norm of a run that does not
// clip: it clips on some steps and not on others.
double ThresholdClippingSomeSteps(const std::vector<double>& norms) {
  std::vector<double> sorted = norms;
  std::sort(sorted.begin(), sorted.end());
  return 0.5 * (sorted.front() + sorted.back());
}

void RandomTrial(uint64_t seed, int trial) {
  std::mt19937_64 rng(seed + uint64_t(trial));
  SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) +
               " (replay: STRATA_TEST_SEED=" + std::to_string(seed) +
               " STRATA_TEST_TRIAL=" + std::to_string(trial) + ")");
  const int L = 1 + int(rng() % 4);
  const std::vector<BlockSpec> specs = RandomModel(rng, L);
  const int mb = 1 + int(rng() % 3);
  const int steps = 5;
  // The norms of a run that never clips fix a threshold that clips some steps only; a tiny
  // one clips every step.
  RunConfig probe;
  probe.micro_batches = mb;
  probe.grad_clip = 1e30;
  auto unclipped = Train(specs, probe, steps);
  ASSERT_TRUE(unclipped.ok()) << unclipped.status().ToString();
  const double clip = trial % 3 == 2 ? 1e-3 : ThresholdClippingSomeSteps(unclipped->rec.norms);

  TempDir dir;
  RunConfig rc;
  rc.micro_batches = mb;
  rc.grad_clip = clip;
  rc.nvme = dir.path();
  rc.device_mem = 0;
  // A random host budget from tight to roomy (the minimum is asked with unlimited budgets).
  RunConfig mins_rc = rc;
  mins_rc.host_mem = 1ull << 34;
  auto probe_engine = MakeEngine(specs, mins_rc, /*init_params=*/false);
  ASSERT_TRUE(probe_engine.ok()) << probe_engine.status().ToString();
  const PlacementReport mins = probe_engine->engine->Placement();
  probe_engine->engine.reset();
  uint64_t all = 0;
  for (const ComponentPlacement& c : mins.components) all += c.bytes;
  rc.host_mem = mins.host_min_bytes + (trial % 2 ? rng() % (2 * all + 1) : all);
  rc.grad_spill = GradSpill(rng() % 3);
  rc.durable = rng() % 4 == 0;
  SCOPED_TRACE("L=" + std::to_string(L) + " mb=" + std::to_string(mb) +
               " clip=" + std::to_string(clip) + " host=" + std::to_string(rc.host_mem) +
               " spill=" + GradSpillName(rc.grad_spill) + " durable=" + std::to_string(rc.durable));

  RunConfig wait = rc;
  wait.speculation = Speculation::kOff;
  auto waited = Train(specs, wait, steps);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->rec.redone_blocks, 0);
  EXPECT_EQ(waited->rec.speculative_steps, 0);

  for (Speculation s : {Speculation::kOn, Speculation::kAuto}) {
    SCOPED_TRACE(std::string("speculation ") + SpeculationName(s));
    TempDir d2;
    RunConfig spec = rc;
    spec.nvme = d2.path();
    spec.speculation = s;
    auto got = Train(specs, spec, steps);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(BitIdentical(waited->states, got->states));
    EXPECT_EQ(got->rec.norms, waited->rec.norms);
    EXPECT_LE(got->rec.peak_host, spec.host_mem);
    if (s == Speculation::kOn && got->rec.speculative_steps == steps) {
      // Every step speculated, and the threshold clipped at least one of them.
      EXPECT_GT(got->rec.redone_blocks, 0);
    }
  }
}

TEST(EngineSpeculationTest, RandomModelsBudgetsAndThresholdsMatchWaitingBitForBit) {
  SetLogSink([](LogLevel, std::string_view) {});
  const char* env_seed = std::getenv("STRATA_TEST_SEED");
  const uint64_t seed = env_seed ? std::strtoull(env_seed, nullptr, 10) : std::random_device{}();
  const char* env_trial = std::getenv("STRATA_TEST_TRIAL");
  for (int trial = 0; trial < 6 && !HasFailure(); ++trial) {
    if (env_trial && trial != std::atoi(env_trial)) continue;
    RandomTrial(seed, trial);
  }
  SetLogSink(nullptr);
}

std::vector<BlockSpec> FixedModel() {
  std::vector<BlockSpec> specs;
  for (int b = 0; b < 4; ++b) {
    specs.push_back(BlockSpec{"h." + std::to_string(b),
                              {TensorSpec{"w", {1023, 3}, true}, TensorSpec{"b", {17}, false}}});
  }
  return specs;
}

// With every state on NVMe and a threshold that clips every step, `kOn` speculates and
// redoes every block of every step; the host minimum with gradients on NVMe is no more
// than without clipping.
TEST(EngineSpeculationTest, EveryStepRedoneAndTheHostMinimumDropsToTheUnclippedOne) {
  const std::vector<BlockSpec> specs = FixedModel();
  TempDir dir;
  RunConfig rc;
  rc.nvme = dir.path();
  rc.host_mem = 1ull << 34;
  rc.grad_clip = 0;
  auto unclipped = MakeEngine(specs, rc, false);
  ASSERT_TRUE(unclipped.ok()) << unclipped.status().ToString();
  const uint64_t min_unclipped = unclipped->engine->Placement().host_min_bytes;
  unclipped->engine.reset();
  rc.grad_clip = 1e-3;
  rc.grad_spill = GradSpill::kOff;
  auto held = MakeEngine(specs, rc, false);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const uint64_t min_held = held->engine->Placement().host_min_bytes;
  held->engine.reset();
  rc.grad_spill = GradSpill::kAuto;
  auto spilled = MakeEngine(specs, rc, false);
  ASSERT_TRUE(spilled.ok()) << spilled.status().ToString();
  const uint64_t min_spilled = spilled->engine->Placement().host_min_bytes;
  spilled->engine.reset();
  EXPECT_GT(min_held, min_unclipped);
  EXPECT_LE(min_spilled, min_unclipped);

  rc.host_mem = min_spilled;
  rc.speculation = Speculation::kOn;
  TempDir d2;
  rc.nvme = d2.path();
  auto got = Train(specs, rc, 4);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  RunConfig wait = rc;
  wait.speculation = Speculation::kOff;
  TempDir d3;
  wait.nvme = d3.path();
  auto waited = Train(specs, wait, 4);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_TRUE(BitIdentical(waited->states, got->states));
  if (got->rec.speculative_steps > 0) {
    EXPECT_EQ(got->rec.redone_blocks, got->rec.speculative_steps * int64_t(specs.size()));
  }
  // Under kAuto a clipping step makes the next wait: only the first step speculates.
  rc.speculation = Speculation::kAuto;
  TempDir d4;
  rc.nvme = d4.path();
  auto automatic = Train(specs, rc, 4);
  ASSERT_TRUE(automatic.ok()) << automatic.status().ToString();
  EXPECT_TRUE(BitIdentical(waited->states, automatic->states));
  EXPECT_LE(automatic->rec.speculative_steps, 1);
}

// Found by bench/clip_speculation.sh: a redo wrote the new version of a block's state beside
// its speculative one, and the swap file (room for a committed and a pending version of each
// extent, plus 16 MiB) ran out once an extent was larger than that slack.
TEST(EngineSpeculationTest, RedoOfExtentsLargerThanTheSwapSlackFits) {
  SetLogSink([](LogLevel, std::string_view) {});
  std::vector<BlockSpec> specs;
  for (int b = 0; b < 2; ++b) {  // 24 MiB per fp32 state
    specs.push_back(BlockSpec{"big." + std::to_string(b), {TensorSpec{"w", {6 << 20}, true}}});
  }
  TempDir dir;
  RunConfig rc;
  rc.nvme = dir.path();
  rc.host_mem = 300 << 20;  // below the states (2 x 96 MiB with gradients): NVMe homes
  rc.grad_clip = 1e-3;      // clips every step
  rc.speculation = Speculation::kOn;
  auto got = Train(specs, rc, 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->rec.speculative_steps, 3);
  EXPECT_GE(got->rec.redone_blocks, 3);  // every step redoes its NVMe-homed block(s)
  SetLogSink(nullptr);
}

// The fake model with a non-finite gradient in block 0 (the last to land) at `bad_step`.
Status RunWithLateNaN(Fixture& f, int64_t steps, int64_t bad_step, RunRecord* rec) {
  Engine& e = *f.engine;
  Device& d = *f.device;
  const int L = int(e.Layout().size());
  for (int64_t step = 1; step <= steps; ++step) {
    STRATA_RETURN_IF_ERROR(e.BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}));
    for (int b = 0; b < L; ++b) {
      STRATA_ASSIGN_OR_RETURN(BlockView v, e.Acquire(b, Pass::kForward));
      (void)v;
      STRATA_RETURN_IF_ERROR(e.Release(b));
    }
    for (int b = L - 1; b >= 0; --b) {
      STRATA_ASSIGN_OR_RETURN(BlockView v, e.Acquire(b, Pass::kBackward));
      STRATA_ASSIGN_OR_RETURN(float* g, e.GradBuffer(b));
      const bool nan = step == bad_step && b == 0;
      STRATA_RETURN_IF_ERROR(d.EnqueueHostFunction(
          Lane::kCompute,
          [v, g, step, nan] {
            for (const TensorLayout& t : v.layout->tensors) {
              for (uint64_t i = 0; i < t.numel; ++i) {
                const uint64_t k = t.offset + i;
                g[k] = 0.3f * testing::Param(v, k) + float(int((k + uint64_t(step)) % 5)) * 0.01f;
              }
            }
            if (nan) g[0] = std::numeric_limits<float>::quiet_NaN();
            return Status::OK();
          },
          "backward"));
      STRATA_RETURN_IF_ERROR(e.SubmitGrads(b));
      STRATA_RETURN_IF_ERROR(e.Release(b));
    }
    STRATA_ASSIGN_OR_RETURN(StepStats st, e.EndStep());
    rec->redone_blocks += st.redone_blocks;
    rec->skipped_steps += st.skipped ? 1 : 0;
    rec->speculative_steps += st.speculative ? 1 : 0;
  }
  return Status::OK();
}

TEST(EngineSpeculationTest, LateNonFiniteGradientUndoesTheSpeculativeUpdates) {
  SetLogSink([](LogLevel, std::string_view) {});
  const std::vector<BlockSpec> specs = FixedModel();
  std::vector<std::vector<float>> states[2];
  RunRecord recs[2];
  for (int k = 0; k < 2; ++k) {
    TempDir dir;
    RunConfig rc;
    rc.nvme = dir.path();
    rc.host_mem = 8 << 20;
    rc.grad_clip = 1e6;  // never clips: only the NaN invalidates the speculation
    rc.durable = true;   // host homes with committed NVMe versions: restorable
    rc.speculation = k == 0 ? Speculation::kOff : Speculation::kOn;
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Status s = RunWithLateNaN(*f, 4, 2, &recs[k]);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto got = States(*f->engine);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    states[k] = *got;
  }
  EXPECT_TRUE(BitIdentical(states[0], states[1]));
  EXPECT_EQ(recs[0].skipped_steps, 1);
  EXPECT_EQ(recs[1].skipped_steps, 1);
  EXPECT_EQ(recs[1].speculative_steps, 4);
  // Blocks 3..1 may have been updated before block 0's NaN landed (then undone); block 0
  // never is.
  EXPECT_LE(recs[1].redone_blocks, 3);
  SetLogSink(nullptr);
}

// A drive failing while a redo reads or writes: EndStep fails naming it, nothing of the step
// is committed, and resuming from the last commit continues exactly as a run that never
// failed.
TEST(EngineSpeculationTest, FaultDuringARedoLeavesTheLastCommitResumable) {
  SetLogSink([](LogLevel, std::string_view) {});
  const std::vector<BlockSpec> specs = FixedModel();
  const int steps = 4;
  RunConfig base;
  base.host_mem = 8 << 20;
  base.grad_clip = 1e-3;  // clips every step: every speculative step is redone
  base.speculation = Speculation::kOn;
  base.durable = true;
  TempDir ref_dir;
  RunConfig ref_rc = base;
  ref_rc.nvme = ref_dir.path();
  auto ref = Train(specs, ref_rc, steps);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  ASSERT_GT(ref->rec.redone_blocks, 0);
  int failures = 0, redo_failures = 0;
  for (const char* kind : {"read", "write"}) {
    for (int at : {20, 35, 50, 65, 80, 95}) {
      SCOPED_TRACE(std::string(kind) + " error at request " + std::to_string(at));
      TempDir dir;
      RunConfig rc = base;
      rc.nvme = dir.path();
      FaultInjectionOptions fo;
      (std::string(kind) == "read" ? fo.eio_read_at : fo.eio_write_at) = uint64_t(at);
      rc.io_factory = FaultInjectionFactory(fo);
      int64_t done = 0;
      {
        auto f = MakeEngine(specs, rc);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        Status s;
        for (int64_t step = 1; step <= steps && s.ok(); ++step) {
          s = RunSteps(*f, step, step, 1, nullptr);
          if (s.ok()) done = step;
        }
        if (s.ok()) continue;  // the request fell outside the run
        ++failures;
        EXPECT_NE(s.message().find("injected"), std::string::npos) << s.ToString();
        if (s.message().find("redo") != std::string::npos) ++redo_failures;
      }
      RunConfig resume = base;
      resume.nvme = dir.path();
      resume.resume = true;
      auto f = MakeEngine(specs, resume);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      const int64_t from = f->engine->ResumedStep();
      EXPECT_LE(from, done);
      Status s = RunSteps(*f, from + 1, steps, 1, nullptr);
      ASSERT_TRUE(s.ok()) << s.ToString();
      auto got = States(*f->engine);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(BitIdentical(ref->states, *got));
    }
  }
  EXPECT_GT(failures, 0);
  EXPECT_GT(redo_failures, 0);
  SetLogSink(nullptr);
}

}  // namespace
}  // namespace strata
