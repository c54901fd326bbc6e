// The engine tests' harness: random models, one run's knobs (RunConfig), an engine on a
// HostDevice (MakeEngine), steps of the fake model (RunSteps), and the states compared bit
// for bit. Shared by the engine test binaries.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/fault_injection.h"
#include "tests/engine/fake_model.h"
#include "tests/engine/random_model.h"
#include "tests/temp_dir.h"

namespace strata::engine_test {

// A fresh folder under /var/tmp, removed at the end.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("strata_engine_test") {}
};

// One training run's knobs.
struct RunConfig {
  uint64_t device_mem = 0;
  uint64_t host_mem = 0;
  std::string nvme;  // "" = none
  int micro_batches = 1;
  double grad_clip = 0;
  bool durable = false;
  bool resume = false;
  double eps = EngineOptions{}.eps;
  WorkingDtype dtype = WorkingDtype::kFp32;
  StateFormat state_format = StateFormat::kFp32;
  bool convert_state_format = false;  // EngineOptions::convert_state_format
  MasterFormat master_format = MasterFormat::kFp32;
  Speculation speculation = Speculation::kAuto;
  GradSpill grad_spill = GradSpill::kAuto;
  bool pipeline = EngineOptions{}.pipeline_updates;
  std::vector<ScheduleEntry> schedule;  // empty = standard
  IoBackendFactory io_factory;          // empty = the default backend
  std::string trace_path;               // EngineOptions::trace_path
};

struct Fixture {
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;
};

// The fake model's starting values (testing::InitValue) written into every block of `e`.
inline Status WriteInitialParams(Engine& e) {
  for (int b = 0; b < int(e.Layout().size()); ++b) {
    const auto& layout = e.Layout()[b];
    for (int t = 0; t < int(layout.tensors.size()); ++t) {
      std::vector<float> v(layout.tensors[t].numel);
      for (size_t i = 0; i < v.size(); ++i) v[i] = testing::InitValue(b, t, i);
      STRATA_RETURN_IF_ERROR(e.WriteParams(b, t, v));
    }
  }
  return Status::OK();
}

// One step (lr 0.01) through every block forward and back, block b's gradient written by
// fill(b, grad, padded element count) on the compute lane.
inline Result<StepStats> StepWithGradients(const Fixture& f,
                                           const std::function<void(int, float*, uint64_t)>& fill) {
  Engine& e = *f.engine;
  const int L = int(e.Layout().size());
  STRATA_RETURN_IF_ERROR(e.BeginStep(StepArgs{.lr = 0.01}));
  for (int b = 0; b < L; ++b) {
    STRATA_RETURN_IF_ERROR(e.Acquire(b, Pass::kForward).status());
    STRATA_RETURN_IF_ERROR(e.Release(b));
  }
  for (int b = L - 1; b >= 0; --b) {
    STRATA_RETURN_IF_ERROR(e.Acquire(b, Pass::kBackward).status());
    STRATA_ASSIGN_OR_RETURN(float* grad, e.GradBuffer(b));
    const uint64_t n = e.Layout()[b].padded_numel;
    STRATA_RETURN_IF_ERROR(f.device->EnqueueHostFunction(
        Lane::kCompute,
        [grad, n, b, fill] {
          fill(b, grad, n);
          return Status::OK();
        },
        "grad"));
    STRATA_RETURN_IF_ERROR(e.SubmitGrads(b));
    STRATA_RETURN_IF_ERROR(e.Release(b));
  }
  return e.EndStep();
}

inline Result<Fixture> MakeEngine(const std::vector<BlockSpec>& specs, const RunConfig& rc,
                                  bool init_params = true) {
  Fixture f;
  DeviceOptions dopt;
  dopt.memory_budget_bytes = rc.device_mem;
  STRATA_ASSIGN_OR_RETURN(f.device, CreateHostDevice(dopt));
  EngineOptions opt;
  opt.device = f.device.get();
  opt.device_mem_bytes = rc.device_mem;
  opt.host_mem_bytes = rc.host_mem;
  if (!rc.nvme.empty()) opt.nvme_paths = {rc.nvme};
  opt.nvme_stripe_bytes = 64 << 10;
  opt.micro_batches = rc.micro_batches;
  opt.grad_clip = rc.grad_clip;
  opt.weight_decay = 0.1;
  opt.durable = rc.durable;
  opt.resume = rc.resume;
  opt.eps = rc.eps;
  opt.io_backend_factory = rc.io_factory;
  opt.dtype = rc.dtype;
  opt.state_format = rc.state_format;
  opt.convert_state_format = rc.convert_state_format;
  opt.master_format = rc.master_format;
  opt.schedule = rc.schedule;
  opt.speculation = rc.speculation;
  opt.grad_spill = rc.grad_spill;
  opt.pipeline_updates = rc.pipeline;
  opt.trace_path = rc.trace_path;
  STRATA_ASSIGN_OR_RETURN(f.engine, Engine::Create(specs, opt));
  if (init_params && !rc.resume) STRATA_RETURN_IF_ERROR(WriteInitialParams(*f.engine));
  return f;
}

// Runs steps first..last (1-based global numbers) of the fake model. Records peaks.
struct RunRecord {
  uint64_t peak_device = 0, peak_host = 0;
  std::vector<double> norms;
  int64_t redone_blocks = 0, speculative_steps = 0, skipped_steps = 0;
  int64_t deferred_blocks = 0;  // updates run under the next step (pipeline_updates)
};

inline Status RunSteps(Fixture& f, int64_t first, int64_t last, int micro_batches, RunRecord* rec,
                       testing::CallerGrads* caller = nullptr, bool zero_last = false) {
  Engine& e = *f.engine;
  Device& d = *f.device;
  for (int64_t step = first; step <= last; ++step) {
    STRATA_RETURN_IF_ERROR(e.BeginStep(StepArgs{.lr = 0.01, .grad_scale = 0.5}));
    for (int m = 0; m < micro_batches; ++m) {
      STRATA_RETURN_IF_ERROR(testing::RunFakeMicroBatch(e, d, step, m, caller, zero_last));
    }
    STRATA_ASSIGN_OR_RETURN(StepStats st, e.EndStep());
    if (caller) {
      if (e.GradsRead() < (caller->held.empty() ? 0 : caller->held.back().first)) {
        return Status::Aborted("EndStep returned before the engine read every caller gradient");
      }
      caller->DropRead(e);
    }
    if (st.step != step) {
      return Status::Aborted("EndStep says step " + std::to_string(st.step) + ", expected " +
                             std::to_string(step));
    }
    if (rec) {
      rec->peak_device = std::max(rec->peak_device, st.peak_device_bytes);
      rec->peak_host = std::max(rec->peak_host, st.peak_host_bytes);
      rec->norms.push_back(st.grad_norm);
      rec->redone_blocks += st.redone_blocks;
      rec->speculative_steps += st.speculative ? 1 : 0;
      rec->skipped_steps += st.skipped ? 1 : 0;
      rec->deferred_blocks += st.deferred_blocks;
    }
  }
  return Status::OK();
}

// All master weights and moments, block by block.
inline Result<std::vector<std::vector<float>>> States(const Engine& e) {
  std::vector<std::vector<float>> out;
  for (int b = 0; b < int(e.Layout().size()); ++b) {
    for (Component c : {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq}) {
      std::vector<float> v(e.Layout()[b].shard_numel);
      STRATA_RETURN_IF_ERROR(e.ReadComponent(b, c, v));
      out.push_back(std::move(v));
    }
  }
  return out;
}

// One fresh run of `steps` steps: the states it ends with and its record. With `from_caller`
// the gradients go in from the model's own memory (SubmitGradsFrom); `zero_last`: see
// RunFakeMicroBatch.
struct Outcome {
  std::vector<std::vector<float>> states;
  RunRecord rec;
  uint64_t max_caller_held = 0;  // from_caller: the most submissions held at once
};

inline Result<Outcome> Train(const std::vector<BlockSpec>& specs, const RunConfig& rc, int steps,
                             bool from_caller = false, bool zero_last = false) {
  STRATA_ASSIGN_OR_RETURN(Fixture f, MakeEngine(specs, rc));
  Outcome out;
  testing::CallerGrads caller;
  STRATA_RETURN_IF_ERROR(RunSteps(f, 1, steps, rc.micro_batches, &out.rec,
                                  from_caller ? &caller : nullptr, zero_last));
  if (!caller.held.empty()) return Status::Aborted("caller memory still held after EndStep");
  out.max_caller_held = caller.max_held;
  STRATA_ASSIGN_OR_RETURN(out.states, States(*f.engine));
  return out;
}

inline ::testing::AssertionResult BitIdentical(const std::vector<std::vector<float>>& a,
                                               const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "different component count";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
      size_t j = 0;
      while (j < a[i].size() && std::memcmp(&a[i][j], &b[i][j], 4) == 0) ++j;
      return ::testing::AssertionFailure()
             << "component " << i << " (block " << i / 3 << ", "
             << "master/m/v"[0] << i % 3 << ") differs at element " << j << ": "
             << (j < a[i].size() ? a[i][j] : 0) << " vs " << (j < b[i].size() ? b[i][j] : 0);
    }
  }
  return ::testing::AssertionSuccess();
}

// The states after `steps` steps with unlimited budgets (the reference every budgeted run
// must equal bit for bit), and each step's gradient norm.
inline Result<std::vector<std::vector<float>>> UnlimitedStates(
    const std::vector<BlockSpec>& specs, int steps, int micro_batches, double clip,
    std::vector<double>* norms = nullptr, WorkingDtype dtype = WorkingDtype::kFp32) {
  RunConfig rc;
  rc.dtype = dtype;
  rc.micro_batches = micro_batches;
  rc.grad_clip = clip;
  STRATA_ASSIGN_OR_RETURN(Outcome run, Train(specs, rc, steps));
  if (norms) *norms = run.rec.norms;
  return std::move(run.states);
}

// The minimum budgets the planner reports for this model.
// The minimum host budget depends on the device budget (a smaller device re-copies params
// in backward, and those copies need host staging), so it is asked for with the device
// budget the run will use.
inline PlacementReport Minimums(const std::vector<BlockSpec>& specs, int micro_batches, double clip,
                                const std::string& nvme, uint64_t device_mem = 1ull << 34) {
  RunConfig rc;
  rc.micro_batches = micro_batches;
  rc.grad_clip = clip;
  rc.nvme = nvme;
  rc.host_mem = 1ull << 34;
  rc.device_mem = device_mem;
  auto f = MakeEngine(specs, rc, /*init_params=*/false);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? f->engine->Placement() : PlacementReport{};
}

// A fixed model of three blocks with odd tensor sizes.
inline std::vector<BlockSpec> ThreeBlockModel() {
  return {BlockSpec{"emb", {TensorSpec{"w", {1023, 3}, true}, TensorSpec{"b", {17}, false}}},
          BlockSpec{"h.0", {TensorSpec{"w", {4096, 2}, true}}},
          BlockSpec{"h.1", {TensorSpec{"w", {15, 15}, true}, TensorSpec{"ln", {1}, false}}}};
}

// Budgets at the planner's minimums with NVMe (and a durable store).
inline RunConfig TightNvme(const std::vector<BlockSpec>& specs, const std::string& dir, int mb = 1,
                           double clip = 0) {
  const uint64_t device_min = Minimums(specs, mb, clip, dir).device_min_bytes;
  const PlacementReport mins = Minimums(specs, mb, clip, dir, device_min);
  RunConfig rc;
  rc.nvme = dir;
  rc.device_mem = device_min;
  rc.host_mem = mins.host_min_bytes;
  rc.micro_batches = mb;
  rc.grad_clip = clip;
  rc.durable = true;
  return rc;
}

}  // namespace strata::engine_test
