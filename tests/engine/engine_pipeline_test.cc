// The pipelined step boundary (EngineOptions::pipeline_updates): with clipping, the updates
// that wait for the global norm run under the next step's forward, in the order it needs the
// blocks, and the step commits during it. Nothing is predicted, only reordered, so every
// norm and every committed state is bit-identical to the updates that wait at the end of the
// step: random models, budgets from the minimum up, micro-batches 1-3, thresholds that clip
// on some steps and not on others, gradients spilled and held, with and without speculation.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/engine.h"
#include "strata/io.h"
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
  if (nvme) {
    EXPECT_LE(got->rec.peak_host, piped.host_mem);
  }
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

// A gate the test closes to hold every NVMe write submitted meanwhile (GatedWrites).
struct WriteGate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  bool reads_open = true;  // SetReads: reads wait too while false
  int held = 0;            // writes held so far
  int held_reads = 0;      // reads held so far
  void Set(bool is_open) {
    std::lock_guard<std::mutex> l(mu);
    open = is_open;
    cv.notify_all();
  }
  void SetReads(bool is_open) {
    std::lock_guard<std::mutex> l(mu);
    reads_open = is_open;
    cv.notify_all();
  }
  bool AllOpen() const { return open && reads_open; }
};

// An NVMe backend whose writes wait while the gate is closed (reads pass, unless the gate
// holds them too): what waits for an operation then waits for the test.
class GatedWrites final : public IoBackend {
 public:
  GatedWrites(std::unique_ptr<IoBackend> inner, std::shared_ptr<WriteGate> gate)
      : inner_(std::move(inner)),
        gate_(std::move(gate)),
        name_("gated(" + std::string(inner_->Name()) + ")") {}
  std::string_view Name() const override { return name_; }
  uint32_t Capabilities() const override { return inner_->Capabilities(); }
  uint32_t QueueDepth() const override { return inner_->QueueDepth(); }
  Result<int> OpenFile(const std::string& path, const OpenOptions& o) override {
    return inner_->OpenFile(path, o);
  }
  Status CloseFile(int file) override { return inner_->CloseFile(file); }
  bool IsDirect(int file) const override { return inner_->IsDirect(file); }
  Status Allocate(int file, uint64_t bytes) override { return inner_->Allocate(file, bytes); }
  Status Sync(int file) override { return inner_->Sync(file); }
  Status RegisterBuffers(std::span<const BufferRegion> regions) override {
    return inner_->RegisterBuffers(regions);
  }
  Status CheckRequest(const IoRequest& r) const override { return inner_->CheckRequest(r); }
  Status Submit(std::span<const IoRequest> requests) override {
    std::vector<IoRequest> now;
    {
      std::lock_guard<std::mutex> l(gate_->mu);
      for (const IoRequest& r : requests) {
        const bool write = r.op == IoOp::kWrite;
        if (write ? !gate_->open : !gate_->reads_open) {
          held_.push_back(r);
          ++(write ? gate_->held : gate_->held_reads);
          gate_->cv.notify_all();
        } else {
          now.push_back(r);
        }
      }
    }
    return now.empty() ? Status::OK() : inner_->Submit(now);
  }
  Result<size_t> Poll(std::span<IoCompletion> out, size_t min_complete) override {
    std::vector<IoRequest> release;
    {
      std::unique_lock<std::mutex> l(gate_->mu);
      // Nothing else to wait for: a short wait for the gate, then back to the caller (which
      // submits its next requests and polls again).
      if (!held_.empty() && !gate_->AllOpen() && inner_->InFlight() == 0) {
        gate_->cv.wait_for(l, std::chrono::milliseconds(1));
        if (!gate_->AllOpen()) return size_t(0);
      }
      if (gate_->AllOpen()) release.swap(held_);
    }
    if (!release.empty()) STRATA_RETURN_IF_ERROR(inner_->Submit(release));
    return inner_->Poll(out, min_complete);
  }
  size_t InFlight() const override { return inner_->InFlight() + held_.size(); }

 private:
  std::unique_ptr<IoBackend> inner_;
  std::shared_ptr<WriteGate> gate_;
  std::string name_;
  std::vector<IoRequest> held_;  // guarded by gate_->mu
};

// `rc` pipelined, its store in `nvme`, its NVMe operations behind `gate`.
RunConfig PipelinedBehind(std::shared_ptr<WriteGate> gate, RunConfig rc, const std::string& nvme) {
  rc.nvme = nvme;
  rc.pipeline = true;
  rc.io_factory = [gate](const IoBackendOptions& o) -> Result<std::unique_ptr<IoBackend>> {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> inner, CreateIoBackend(o));
    return std::unique_ptr<IoBackend>(std::make_unique<GatedWrites>(std::move(inner), gate));
  };
  return rc;
}

// The rest of step `step` after its Acquire(0, forward) (block 0 released, blocks 1.. run),
// steps up to `last`, and the states then: `want`'s bit for bit.
void FinishAfterBlock0(Fixture& f, int64_t step, int64_t last,
                       const std::vector<std::vector<float>>& want, RunRecord* rec) {
  ASSERT_TRUE(f.engine->Release(0).ok());
  ASSERT_TRUE(testing::RunFakeMicroBatch(*f.engine, *f.device, step, 0, nullptr, false,
                                         /*first_block=*/1)
                  .ok());
  ASSERT_TRUE(f.engine->EndStep().ok());
  ASSERT_TRUE(RunSteps(f, step + 1, last, 1, rec).ok());
  auto states = States(*f.engine);
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  EXPECT_TRUE(BitIdentical(want, *states));
}

// The next forward's copy of a block waits for the block's deferred update, not for that
// update's NVMe write: the write only reads the host copy, which is final once the update
// ran. With every write of step 2 held back, step 2's Acquire(0, forward) still returns (it
// waited for the write, the demo's stall, before the copy could share a copy being written),
// and once the writes land the run is the waiting run's bit for bit.
TEST(EnginePipelineTest, TheNextForwardWaitsForTheUpdateNotItsWrite) {
  const std::vector<BlockSpec> specs = FixedModel();
  TempDir d1, d2;
  RunConfig rc;
  rc.pipeline = false;
  rc.nvme = d1.path();
  rc.host_mem = 1 << 20;
  rc.grad_clip = 1e-3;  // every step clips: every update is deferred
  rc.speculation = Speculation::kOff;
  rc.grad_spill = GradSpill::kOff;
  uint64_t min = 0, all = 0;
  Minimum(specs, rc, &min, &all);
  rc.host_mem = min + (64 << 10);  // states on NVMe, room to pipeline
  auto waited = Train(specs, rc, 3);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();

  auto gate = std::make_shared<WriteGate>();
  auto f = MakeEngine(specs, PipelinedBehind(gate, rc, d2.path()));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string report = f->engine->Placement().ToString();
  ASSERT_NE(report.find("master of blocks 0-3: home NVMe"), std::string::npos) << report;
  ASSERT_NE(report.find("run under the next step's forward"), std::string::npos) << report;
  RunRecord rec;
  ASSERT_TRUE(RunSteps(*f, 1, 1, 1, &rec).ok());
  ASSERT_EQ(rec.deferred_blocks, int64_t(specs.size()));
  gate->Set(false);
  struct OpenAtExit {  // the engine's threads wait for the writes: never leave them held
    WriteGate* g;
    ~OpenAtExit() { g->Set(true); }
  } open_at_exit{gate.get()};
  ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}).ok());
  auto acquired =
      std::async(std::launch::async, [&] { return f->engine->Acquire(0, Pass::kForward); });
  const bool returned = acquired.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  int held;
  {
    // The update's write may be submitted after the Acquire returned (the I/O thread queues it
    // once the update ran): wait for it, the gate still closed, so that a write was held
    // while the Acquire returned without it.
    std::unique_lock<std::mutex> l(gate->mu);
    gate->cv.wait_for(l, std::chrono::seconds(20), [&] { return gate->held > 0; });
    held = gate->held;
  }
  gate->Set(true);
  EXPECT_TRUE(returned) << "Acquire(0, forward) waited for block 0's NVMe write";
  EXPECT_GT(held, 0) << "no write of the deferred updates was held: the test tests nothing";
  ASSERT_TRUE(acquired.get().ok());
  FinishAfterBlock0(*f, 2, 3, waited->states, &rec);
}

// `blocks` blocks of one 1023 x 3 tensor each.
std::vector<BlockSpec> OneTensorBlocks(int blocks) {
  std::vector<BlockSpec> specs;
  for (int b = 0; b < blocks; ++b) {
    specs.push_back(BlockSpec{"h." + std::to_string(b), {TensorSpec{"w", {1023, 3}, true}}});
  }
  return specs;
}

// Every state committed every step (durable), every step clipping (so every update waits for
// the norm), gradients spilled or not: the run whose updates wait at the end of the step,
// its store in `nvme`.
RunConfig DurableClippingEveryStep(const std::string& nvme, GradSpill spill) {
  RunConfig rc;
  rc.pipeline = false;
  rc.nvme = nvme;
  rc.durable = true;
  rc.grad_clip = 1e-3;
  rc.speculation = Speculation::kOff;
  rc.grad_spill = spill;
  return rc;
}

// A home copy's write (a host-homed state, committed every step: durable) waits until the
// step's carried updates all ran, so the next forward's loads have the drive; the carried
// commit still waits for it. Every state at home, gradients spilled and some evicted: with
// NVMe reads held at step 3, block 0's carried update runs (its gradient landed last, so it
// stayed) and the forward acquires block 0, while the updates that wait for a reloaded
// gradient cannot run; no write is submitted meanwhile. Then the run is the waiting run's.
TEST(EnginePipelineTest, HomeWritesWaitForTheCarriedUpdates) {
  const std::vector<BlockSpec> specs = OneTensorBlocks(16);
  TempDir d1, d2;
  RunConfig rc = DurableClippingEveryStep(d1.path(), GradSpill::kOn);
  uint64_t min = 0, all = 0;
  Minimum(specs, rc, &min, &all);
  // The least budget (in steps of a 64th of every component) that keeps every state at home:
  // its cache holds some of the gradients, not all.
  std::string report;
  for (rc.host_mem = min;; rc.host_mem += all / 64) {
    ASSERT_LT(rc.host_mem, 4 * all + min) << report;
    TempDir probe_dir;
    RunConfig probe = rc;
    probe.nvme = probe_dir.path();
    auto p = MakeEngine(specs, probe, /*init_params=*/false);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    report = p->engine->Placement().ToString();
    if (report.find("home NVMe") == std::string::npos) break;
  }
  auto waited = Train(specs, rc, 4);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();

  auto gate = std::make_shared<WriteGate>();
  auto f = MakeEngine(specs, PipelinedBehind(gate, rc, d2.path()));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  report = f->engine->Placement().ToString();
  ASSERT_NE(report.find("run under the next step's forward"), std::string::npos) << report;
  ASSERT_NE(report.find("written to NVMe at their final landing"), std::string::npos) << report;
  RunRecord rec;
  ASSERT_TRUE(RunSteps(*f, 1, 2, 1, &rec).ok());
  struct OpenAtExit {  // the engine's threads wait for the I/O: never leave it held
    WriteGate* g;
    ~OpenAtExit() {
      g->SetReads(true);
      g->Set(true);
    }
  } open_at_exit{gate.get()};
  gate->Set(false);
  gate->SetReads(false);
  ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}).ok());
  auto acquired =
      std::async(std::launch::async, [&] { return f->engine->Acquire(0, Pass::kForward); });
  const bool returned = acquired.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  int held_writes, held_reads;
  {
    std::unique_lock<std::mutex> l(gate->mu);
    gate->cv.wait_for(l, std::chrono::seconds(20), [&] { return gate->held_reads > 0; });
    // Long enough for the I/O thread to have queued block 0's writes, had they not waited.
    gate->cv.wait_for(l, std::chrono::milliseconds(300), [&] { return gate->held > 0; });
    held_writes = gate->held;
    held_reads = gate->held_reads;
  }
  gate->SetReads(true);
  gate->Set(true);
  ASSERT_TRUE(returned) << "Acquire(0, forward) waited for a read: block 0's gradient was "
                           "evicted, and the test tests nothing";
  ASSERT_GT(held_reads, 0) << "no carried update waited for a read: the test tests nothing\n"
                           << report;
  EXPECT_EQ(held_writes, 0) << "a home copy's write was submitted under the carried updates";
  ASSERT_TRUE(acquired.get().ok());
  FinishAfterBlock0(*f, 3, 4, waited->states, &rec);
}

// The carried commit waits for the home copies' writes, which go only once the carried
// updates ran: by then the step's backward is landing gradients, and a final gradient stays
// in memory until its norm is known, so the optimizer computes the norms while the commit
// waits (at GPT-2 large the landings behind them stalled the backward for a second). Every
// state at home (durable), every write held from step 3 on: step 3's whole backward lands,
// and every norm of it is computed before the commit of step 2 (the trace's "norm" events
// end before "commit step 2" begins). Then the run is the waiting run's.
TEST(EnginePipelineTest, NormsAreComputedWhileTheCarriedCommitWaits) {
  const std::vector<BlockSpec> specs = OneTensorBlocks(8);
  TempDir d1, d2;
  // The landings need no write.
  RunConfig rc = DurableClippingEveryStep(d1.path(), GradSpill::kOff);
  auto waited = Train(specs, rc, 4);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();

  auto gate = std::make_shared<WriteGate>();
  RunConfig traced = PipelinedBehind(gate, rc, d2.path());
  traced.trace_path = d2.path() + "/trace.json";
  auto f = MakeEngine(specs, traced);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string report = f->engine->Placement().ToString();
  ASSERT_EQ(report.find("home NVMe"), std::string::npos) << report;
  ASSERT_NE(report.find("run under the next step's forward"), std::string::npos) << report;
  RunRecord rec;
  ASSERT_TRUE(RunSteps(*f, 1, 2, 1, &rec).ok());
  struct OpenAtExit {  // the engine's threads wait for the writes: never leave them held
    WriteGate* g;
    ~OpenAtExit() { g->Set(true); }
  } open_at_exit{gate.get()};
  gate->Set(false);
  ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}).ok());
  ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, 3, 0).ok());
  ASSERT_TRUE(f->device->SynchronizeLane(Lane::kD2H).ok());
  int held;
  {
    // The home writes go once the carried updates ran; then a while for the norms.
    std::unique_lock<std::mutex> l(gate->mu);
    gate->cv.wait_for(l, std::chrono::seconds(20), [&] { return gate->held > 0; });
    held = gate->held;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  gate->Set(true);
  ASSERT_GT(held, 0) << "no home write was held: the test tests nothing";
  ASSERT_TRUE(f->engine->EndStep().ok());
  ASSERT_TRUE(RunSteps(*f, 4, 4, 1, &rec).ok());
  auto states = States(*f->engine);
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  EXPECT_TRUE(BitIdentical(waited->states, *states));
  f->engine.reset();  // closes the trace

  std::ifstream in(traced.trace_path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "trace is not valid JSON";
  double commit = -1, step3 = -1;
  std::vector<std::pair<double, double>> norms;  // every step's
  for (const auto& ev : j["traceEvents"]) {
    if (ev["ph"] != "X") continue;
    const std::string name = ev["name"];
    const double ts = ev["ts"].get<double>(), end = ts + ev["dur"].get<double>();
    if (name == "step 3") step3 = ts;
    if (name == "commit step 2") commit = ts;
    if (name.rfind("norm ", 0) == 0) norms.emplace_back(ts, end);
  }
  ASSERT_GE(step3, 0) << "no step 3 in the trace";
  ASSERT_GE(commit, step3) << "no commit of step 2 inside step 3 in the trace";
  const auto before_commit = std::count_if(
      norms.begin(), norms.end(), [&](auto n) { return n.first >= step3 && n.second <= commit; });
  EXPECT_EQ(before_commit, std::ptrdiff_t(specs.size()))
      << "step 3's norms computed before step 2's commit";
}

// The placement predicts the pipelined steady state when no step speculates (--speculate auto
// with pipelining): each step reloads the spilled gradients of the updates it carries. Every
// state on NVMe (so blocks could speculate), every step clipping, gradients spilled: from step
// 3 on, each step writes the prediction's bytes, and reads them on average: what a step leaves
// cached goes round a cycle (of three steps here), and with it the next step's reads.
TEST(EnginePipelineTest, PredictedBytesAreThePipelinedSteadyState) {
  const std::vector<BlockSpec> specs = FixedModel();
  TempDir dir;
  RunConfig rc;
  rc.nvme = dir.path();
  rc.grad_clip = 1e-3;  // every step clips: every update is deferred
  rc.grad_spill = GradSpill::kOn;
  rc.pipeline = true;
  uint64_t min = 0, all = 0;
  Minimum(specs, rc, &min, &all);
  rc.host_mem = min + (64 << 10);  // states on NVMe, room to pipeline
  auto f = MakeEngine(specs, rc);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string report = f->engine->Placement().ToString();
  ASSERT_NE(report.find("run during backward"), std::string::npos) << report;
  ASSERT_NE(report.find("run under the next step's forward"), std::string::npos) << report;
  const EdgeBytes want = f->engine->Placement().predicted_bytes;
  uint64_t reads = 0;
  for (int64_t step = 1; step <= 11; ++step) {
    ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
    ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, step, 0).ok());
    auto st = f->engine->EndStep();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_EQ(st->deferred_blocks, int64_t(specs.size()));
    if (step < 3) continue;  // the first step carries nothing, the second started from it
    EXPECT_EQ(st->bytes.nvme_write, want.nvme_write) << "step " << step << "\n" << report;
    reads += st->bytes.nvme_read;
  }
  // Steps 3-11: three rounds of the cycle (the prediction's mean rounds down).
  EXPECT_NEAR(double(reads), 9.0 * double(want.nvme_read), 9.0) << report;
  ASSERT_TRUE(f->engine->Flush().ok());
}

// Each step's statistics are final when it commits (TakeCommittedStats): one per step, in
// order, a pipelined step's after the next EndStep (the last after Flush), and each counts
// its own deferred updates: nvme_write bytes equal, step for step, what the same updates write
// at the end of their step (bytes are deterministic), where EndStep's figures of the step,
// taken over its window, hold the previous step's writes instead.
TEST(EnginePipelineTest, CommittedStatsCountEachStepsOwnDeferredUpdates) {
  const std::vector<BlockSpec> specs = FixedModel();
  const int steps = 4;
  for (GradSpill spill : {GradSpill::kOff, GradSpill::kOn}) {
    SCOPED_TRACE(GradSpillName(spill));
    std::vector<StepStats> window[2], final[2];
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE(k == 1 ? "pipelined" : "at the end of the step");
      TempDir dir;
      RunConfig rc;
      rc.nvme = dir.path();
      rc.grad_clip = 1e-3;  // every step clips: a pipelined one defers every update
      rc.speculation = Speculation::kOff;
      rc.grad_spill = spill;
      rc.pipeline = k == 1;
      uint64_t min = 0, all = 0;
      Minimum(specs, rc, &min, &all);
      rc.host_mem = min + (64 << 10);  // states on NVMe, room to pipeline
      auto f = MakeEngine(specs, rc);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      EXPECT_TRUE(f->engine->TakeCommittedStats().empty()) << "statistics before any step";
      for (int64_t step = 1; step <= steps; ++step) {
        ASSERT_TRUE(f->engine->BeginStep(StepArgs{.lr = 0.01}).ok());
        ASSERT_TRUE(testing::RunFakeMicroBatch(*f->engine, *f->device, step, 0).ok());
        auto st = f->engine->EndStep();
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        window[k].push_back(*st);
        const std::vector<StepStats> got = f->engine->TakeCommittedStats();
        // At once without pipelining; one step later with it (nothing after step 1).
        const int64_t want = k == 1 ? step - 1 : step;
        ASSERT_EQ(got.size(), want > 0 ? 1u : 0u) << "after EndStep of step " << step;
        if (want > 0) {
          EXPECT_EQ(got[0].step, want);
        }
        final[k].insert(final[k].end(), got.begin(), got.end());
      }
      ASSERT_TRUE(f->engine->Flush().ok());
      const std::vector<StepStats> last = f->engine->TakeCommittedStats();
      ASSERT_EQ(last.size(), k == 1 ? 1u : 0u);
      final[k].insert(final[k].end(), last.begin(), last.end());
      ASSERT_EQ(final[k].size(), size_t(steps));
    }
    for (int i = 0; i < steps; ++i) {
      SCOPED_TRACE("step " + std::to_string(i + 1));
      const StepStats& piped = final[1][i];
      EXPECT_EQ(piped.step, i + 1);
      EXPECT_GT(piped.bytes.nvme_write, 0u);
      EXPECT_EQ(piped.bytes.nvme_write, final[0][i].bytes.nvme_write);
      EXPECT_EQ(final[0][i].bytes.nvme_write, window[0][i].bytes.nvme_write);
      EXPECT_EQ(piped.deferred_blocks, int64_t(specs.size()));
      EXPECT_GT(piped.busy_seconds[int(Resource::kCpuOptim)], 0.0);
      if (i + 1 < steps) {
        // Ran under the next step; the last one ran at Flush, a serial tail of its step.
        EXPECT_GT(piped.overlapped_seconds, 0.0);
      } else {
        EXPECT_EQ(piped.overlapped_seconds, 0.0);
        EXPECT_GT(piped.tail_seconds, window[1][i].tail_seconds);
        EXPECT_GT(piped.seconds, window[1][i].seconds);
      }
    }
    // EndStep's window of the first pipelined step holds none of its updates' writes.
    EXPECT_LT(window[1][0].bytes.nvme_write, final[1][0].bytes.nvme_write);
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
