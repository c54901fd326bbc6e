// The pipelined step boundary (EngineOptions::pipeline_updates): with clipping, the updates
// that wait for the global norm run under the next step's forward, in the order it needs the
// blocks, and the step commits during it. Nothing is predicted, only reordered, so every
// norm and every committed state is bit-identical to the updates that wait at the end of the
// step: random models, budgets from the minimum up, micro-batches 1-3, thresholds that clip
// on some steps and not on others, gradients spilled and held, with and without speculation.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
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

double ThresholdClippingSomeSteps(const std::vector<double>& norms) {
  std::vector<double> sorted = norms;
  std::sort(sorted.begin(), sorted.end());
  return 0.5 * (sorted.front() + sorted.back());
}

// The host minimum of `rc` (asked with an unlimited budget) and every state's bytes.
void Minimum(const std::vector<BlockSpec>& specs, RunConfig rc, uint64_t* min, uint64_t* all) {
  rc.host_mem = 1ull << 34;
  TempDir dir;
  if (!rc.nvme.empty()) rc.nvme = dir.path();
  auto probe = MakeEngine(specs, rc, /*init_params=*/false);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  *min = probe->engine->Placement().host_min_bytes;
  *all = 0;
  for (const ComponentPlacement& c : probe->engine->Placement().components) *all += c.bytes;
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
  RunConfig probe;
  probe.micro_batches = mb;
  probe.grad_clip = 1e30;
  auto unclipped = Train(specs, probe, steps);
  ASSERT_TRUE(unclipped.ok()) << unclipped.status().ToString();
  // Some steps clip and some do not; every third trial clips every step.
  const double clip = trial % 3 == 2 ? 1e-3 : ThresholdClippingSomeSteps(unclipped->rec.norms);

  TempDir dir;
  RunConfig rc;
  rc.pipeline = false;  // the reference: updates at the end of each step
  rc.micro_batches = mb;
  rc.grad_clip = clip;
  const bool nvme = trial % 4 != 3;  // one trial in four: host memory only
  if (nvme) rc.nvme = dir.path();
  rc.grad_spill = GradSpill(rng() % 3);
  rc.durable = nvme && rng() % 4 == 0;
  rc.speculation = Speculation(rng() % 3);
  // A separate bf16 working copy (produced by every update, what the next forward copies)
  // and bf16 moments (rounded with the step's key: a carried update must use its own step's).
  rc.dtype = rng() % 2 ? WorkingDtype::kBf16 : WorkingDtype::kFp32;
  rc.state_format = rng() % 2 ? StateFormat::kBf16 : StateFormat::kFp32;
  uint64_t min = 0, all = 0;
  Minimum(specs, rc, &min, &all);
  // At the minimum on even trials, else a random budget up to roomy.
  rc.host_mem = nvme ? min + (trial % 2 ? rng() % (2 * all + 1) : 0) : 0;
  SCOPED_TRACE("L=" + std::to_string(L) + " mb=" + std::to_string(mb) +
               " clip=" + std::to_string(clip) + " host=" + std::to_string(rc.host_mem) +
               " spill=" + GradSpillName(rc.grad_spill) + " durable=" + std::to_string(rc.durable) +
               " speculation=" + SpeculationName(rc.speculation) +
               " dtype=" + WorkingDtypeName(rc.dtype) +
               " moments=" + (rc.state_format == StateFormat::kBf16 ? "bf16" : "fp32"));

  auto waited = Train(specs, rc, steps);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->rec.deferred_blocks, 0);

  TempDir d2;
  RunConfig piped = rc;
  if (nvme) piped.nvme = d2.path();
  piped.pipeline = true;
  auto got = Train(specs, piped, steps);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(BitIdentical(waited->states, got->states));
  EXPECT_EQ(got->rec.norms, waited->rec.norms);
  // `auto` prefers pipelining to speculation (no redo); `on` and `off` do as they did.
  if (rc.speculation != Speculation::kAuto) {
    EXPECT_EQ(got->rec.redone_blocks, waited->rec.redone_blocks);
  }
  if (nvme) EXPECT_LE(got->rec.peak_host, piped.host_mem);
  if (rc.speculation == Speculation::kOff) {
    // Every step waits for the norm: each defers its updates where the placement pipelines.
    TempDir d3;
    if (nvme) piped.nvme = d3.path();
    auto f = MakeEngine(specs, piped, false);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const std::string report = f->engine->Placement().ToString();
    if (report.find("run under the next step's forward") != std::string::npos) {
      EXPECT_GT(got->rec.deferred_blocks, 0) << report;
    } else {
      EXPECT_NE(report.find("pipelining them needs"), std::string::npos) << report;
    }
  }
}

TEST(EnginePipelineTest, RandomModelsBudgetsAndThresholdsMatchWaitingBitForBit) {
  SetLogSink([](LogLevel, std::string_view) {});
  const char* env_seed = std::getenv("STRATA_TEST_SEED");
  const uint64_t seed = env_seed ? std::strtoull(env_seed, nullptr, 10) : std::random_device{}();
  const char* env_trial = std::getenv("STRATA_TEST_TRIAL");
  for (int trial = 0; trial < 12 && !HasFailure(); ++trial) {
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

// Clipping every step with states on NVMe: every step defers every update to the next, the
// placement says so, and the result is the waiting one's.
TEST(EnginePipelineTest, EveryStepDefersEveryUpdateAndMatches) {
  const std::vector<BlockSpec> specs = FixedModel();
  for (GradSpill spill : {GradSpill::kOff, GradSpill::kOn}) {
    SCOPED_TRACE(GradSpillName(spill));
    TempDir d1, d2;
    RunConfig rc;
    rc.pipeline = false;
    rc.nvme = d1.path();
    rc.host_mem = 1 << 20;
    rc.grad_clip = 1e-3;
    rc.speculation = Speculation::kOff;
    rc.grad_spill = spill;
    auto waited = Train(specs, rc, 4);
    ASSERT_TRUE(waited.ok()) << waited.status().ToString();
    rc.nvme = d2.path();
    rc.pipeline = true;
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const std::string report = f->engine->Placement().ToString();
    EXPECT_NE(report.find("run under the next step's forward"), std::string::npos) << report;
    RunRecord rec;
    ASSERT_TRUE(RunSteps(*f, 1, 4, 1, &rec).ok());
    EXPECT_EQ(rec.deferred_blocks, 4 * int64_t(specs.size()));
    auto states = States(*f->engine);
    ASSERT_TRUE(states.ok()) << states.status().ToString();
    EXPECT_TRUE(BitIdentical(waited->states, *states));
    EXPECT_EQ(rec.norms, waited->rec.norms);
  }
}

// The stats and the trace show the overlap: each step (after the first) runs the previous
// step's updates and commit under its own forward (overlapped_seconds, the "adam ... (step
// k)" and "commit step k" events inside step k+1's span), and its own tail is no longer the
// optimizer's: with the updates at the end, the tail holds every update.
TEST(EnginePipelineTest, StatsAndTraceShowTheUpdatesUnderTheNextStep) {
  const std::vector<BlockSpec> specs = FixedModel();
  const int L = int(specs.size());
  TempDir dir;
  const std::string trace = dir.path() + "/trace.json";
  for (bool pipeline : {false, true}) {
    SCOPED_TRACE(pipeline ? "pipelined" : "at the end of the step");
    TempDir swap;
    auto device = CreateHostDevice(DeviceOptions{});
    ASSERT_TRUE(device.ok());
    EngineOptions opt;
    opt.device = device->get();
    opt.host_mem_bytes = 1 << 20;
    opt.nvme_paths = {swap.path()};
    opt.nvme_stripe_bytes = 64 << 10;
    opt.grad_clip = 1e-3;
    opt.pipeline_updates = pipeline;
    if (pipeline) opt.trace_path = trace;
    auto e = Engine::Create(specs, opt);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    Fixture f{std::move(device).value(), std::move(e).value()};
    for (int64_t step = 1; step <= 3; ++step) {
      ASSERT_TRUE(f.engine->BeginStep(StepArgs{.lr = 0.01}).ok());
      ASSERT_TRUE(testing::RunFakeMicroBatch(*f.engine, *f.device, step, 0).ok());
      auto st = f.engine->EndStep();
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      const double optim = st->busy_seconds[int(Resource::kCpuOptim)];
      EXPECT_EQ(st->deferred_blocks, pipeline ? L : 0);
      if (!pipeline) {
        EXPECT_GE(st->tail_seconds, optim) << "an update ran before the last backward";
        EXPECT_EQ(st->overlapped_seconds, 0.0);
      } else if (step > 1) {
        EXPECT_GT(st->overlapped_seconds, 0.0);
        EXPECT_LE(st->overlapped_seconds, st->seconds);
      }
    }
    ASSERT_TRUE(f.engine->Flush().ok());
  }
  // The trace (closed with the engine): step 2's updates and commit inside step 3's span.
  std::ifstream in(trace);
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "trace is not valid JSON";
  double step3_begin = -1, step3_end = -1;
  std::vector<std::pair<double, double>> updates, commits;
  for (const auto& ev : j["traceEvents"]) {
    if (ev["ph"] != "X") continue;
    const std::string name = ev["name"];
    const double ts = ev["ts"].get<double>(), end = ts + ev["dur"].get<double>();
    if (name == "step 3") step3_begin = ts, step3_end = end;
    if (name.rfind("adam ", 0) == 0 && name.find("(step 2)") != std::string::npos) {
      updates.emplace_back(ts, end);
    }
    if (name == "commit step 2") commits.emplace_back(ts, end);
  }
  ASSERT_GE(step3_begin, 0) << j.dump().substr(0, 2000);
  EXPECT_EQ(updates.size(), size_t(L));
  EXPECT_EQ(commits.size(), 1u);
  for (auto [b, e] : updates) {
    EXPECT_GE(b, step3_begin);
    EXPECT_LE(e, step3_end);
  }
  for (auto [b, e] : commits) {
    EXPECT_GE(b, step3_begin);
    EXPECT_LE(e, step3_end);
  }
}

// Reads between steps see the updated values: ReadComponent after EndStep runs the deferred
// updates (and commits), so it returns what the waiting order returns at once.
TEST(EnginePipelineTest, ReadsBetweenStepsWaitForTheDeferredUpdates) {
  const std::vector<BlockSpec> specs = FixedModel();
  std::vector<std::vector<std::vector<float>>> per_step[2];
  for (int k = 0; k < 2; ++k) {
    TempDir dir;
    RunConfig rc;
    rc.nvme = dir.path();
    rc.host_mem = 1 << 20;
    rc.grad_clip = 1e-3;
    rc.pipeline = k == 1;
    auto f = MakeEngine(specs, rc);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    for (int64_t step = 1; step <= 3; ++step) {
      RunRecord rec;
      ASSERT_TRUE(RunSteps(*f, step, step, 1, &rec).ok());
      EXPECT_EQ(rec.deferred_blocks, k == 1 ? int64_t(specs.size()) : 0);
      auto states = States(*f->engine);
      ASSERT_TRUE(states.ok()) << states.status().ToString();
      per_step[k].push_back(*states);
    }
  }
  for (size_t s = 0; s < per_step[0].size(); ++s) {
    EXPECT_TRUE(BitIdentical(per_step[0][s], per_step[1][s])) << "after step " << s + 1;
  }
}

// Found by the 12 x 768 benchmark: with the updates written in forward order, first fit over
// extents of two sizes left the last extent of a step no hole big enough in a swap file with
// a fixed 16 MiB of slack (NoSpace). The slack now grows with the largest extent.
TEST(EnginePipelineTest, ExtentsLargerThanTheFixedSwapSlackFitInForwardOrder) {
  SetLogSink([](LogLevel, std::string_view) {});
  std::vector<BlockSpec> specs;
  specs.push_back(BlockSpec{"embed", {TensorSpec{"w", {983040}, true}}});  // 3.75 MiB
  for (int b = 0; b < 3; ++b) {                                            // 27 MiB per fp32 state
    specs.push_back(BlockSpec{"h." + std::to_string(b), {TensorSpec{"w", {7077888}, true}}});
  }
  specs.push_back(BlockSpec{"ln_f", {TensorSpec{"w", {1536}, false}}});
  TempDir dir;
  RunConfig rc;
  rc.nvme = dir.path();
  rc.host_mem = 200 << 20;  // below the states: NVMe homes
  rc.grad_clip = 1e-3;      // every step defers its updates
  rc.pipeline = true;
  auto got = Train(specs, rc, 4);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->rec.deferred_blocks, 4 * int64_t(specs.size()));
  SetLogSink(nullptr);
}

}  // namespace
}  // namespace strata
