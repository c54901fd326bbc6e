// EngineImpl: the Engine the model calls, the step coordinator (engine.cc), with the
// parameters between steps (engine_params.cc). Internal to engine/; see engine.cc for what
// each thread does and engine_context.h for who owns what.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/activation_stash.h"
#include "engine/collectives.h"
#include "engine/device_tier.h"
#include "engine/engine_context.h"
#include "engine/engine_options.h"
#include "engine/host_tier.h"
#include "engine/optimizer_stage.h"
#include "engine/plan.h"
#include "engine/stats_ledger.h"
#include "strata/engine.h"
#include "strata/log.h"

namespace strata::engine_internal {

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, std::vector<BlockLayout> layout)
      : ctx_(options, std::move(layout)),
        host_(ctx_),
        optimizer_(ctx_, host_, /*ranks_combine_norm=*/options.comm != nullptr),
        device_(ctx_, host_, optimizer_),
        collectives_(CreateCollectives(ctx_, host_, device_, optimizer_)),
        stash_(ctx_, host_) {
    device_.SetCollectives(collectives_.get());
  }
  ~EngineImpl() override;

  Status Init();

  const std::vector<BlockLayout>& Layout() const override { return ctx_.layout; }
  const PlacementReport& Placement() const override { return ctx_.place.report; }
  int64_t ResumedStep() const override { return ctx_.resumed_step; }
  Status WriteParams(int block, int tensor, std::span<const float> values) override;
  Status CommitParams() override;
  Status ReadParams(int block, int tensor, std::span<float> out) const override;
  Status ReadComponent(int block, Component component, std::span<float> out) const override;
  Status WriteComponent(int block, Component component, std::span<const float> values) override;
  Status BeginStep(const StepArgs& args) override;
  Result<BlockView> Acquire(int block, Pass pass) override;
  Status Release(int block) override;
  Result<float*> GradBuffer(int block) override;
  Status SubmitGrads(int block) override;
  Result<uint64_t> SubmitGradsFrom(int block, std::span<const float* const> grads) override;
  uint64_t GradsRead() const override { return device_.TicketsRead(); }
  Result<EventPtr> StashActivation(uint32_t key, const void* src, uint64_t bytes) override {
    return stash_.Stash(key, src, bytes);
  }
  Status FetchActivation(uint32_t key, void* dst, bool last) override {
    return stash_.Fetch(key, dst, last);
  }
  Result<StepStats> EndStep() override;
  Result<double> GradNorm() override;
  Status Flush() override;
  Status SetOptimizerThreads(int threads) override;
  std::vector<StepStats> TakeCommittedStats() override;
  Status Error() const override { return ctx_.Error(); }

 private:
  // The step's host plan, from what the last step left in the cache.
  Result<HostPlan> PlanStepLocked(bool speculative) REQUIRES(ctx_.mu);
  // Whether the step beginning updates speculatively (see Speculation).
  bool SpeculateLocked() const REQUIRES(ctx_.mu);
  // Waits for the step's updates, writes and collectives (what EndStep commits).
  Status WaitStepWorkLocked() REQUIRES(ctx_.mu);
  // EndStep: redoes (or, for a skipped step, undoes) the speculative updates the norm
  // invalidated, then frees the gradients held for them.
  Status RedoSpeculativeLocked(StepStats* st) REQUIRES(ctx_.mu);
  // The checks of Acquire: a step is open, nothing is acquired, and (block, pass) is the
  // schedule's next access. Returns that access.
  Result<int> CheckAcquireLocked(int block, Pass pass) const REQUIRES(ctx_.mu);
  // SubmitGrads and SubmitGradsFrom: checks that `block` is acquired for backward and not yet
  // submitted, then queues its landing (from `sources`, adopted, when given). Returns the
  // ticket (0 without sources).
  Result<uint64_t> Submit(int block, std::vector<const float*> sources);
  // EndStep, once every part finished the step: free the device copies and, with `commit`,
  // commit (else the next step, or a flush, commits it once its deferred updates ran).
  Status FinishStepLocked(uint64_t step_number, bool commit) REQUIRES(ctx_.mu);
  // Runs the deferred updates of the last step now, on this thread, and commits it (between
  // steps: a read, a write, a flush or the end). OK when none are pending.
  Status DrainLocked() REQUIRES(ctx_.mu);
  Status RefusePartialUpdateLocked(uint64_t step_number) REQUIRES(ctx_.mu);
  // With ranks: EndStep commits the step whose updates this one carried (a collective, so
  // made on the model's thread at the same point on every rank). OK without one.
  Status CommitCarriedWithRanksLocked() REQUIRES(ctx_.mu);
  // Whether `plan` runs updates of its own step before EndStep (a speculative step).
  static bool OwnUpdatesBeforeEndStep(const HostPlan& plan);
  void StatsLocked(uint64_t step_number, StepStats* st) REQUIRES(ctx_.mu);
  // What the last step's deferred updates cost inside this step (they ran and committed
  // before EndStep); nullopt when it carried none.
  std::optional<DeferredCost> CarriedCostLocked() REQUIRES(ctx_.mu);
  void OnDeviceOp(const DeviceOpRecord& r);
  Status CheckBlockTensor(int block, int tensor) const;

  // Declared first: every part refers to it.
  EngineContext ctx_;
  HostTier host_;
  OptimizerStage optimizer_;
  DeviceTier device_;
  std::unique_ptr<Collectives> collectives_;
  ActivationStash stash_;  // its own lock, taken under ctx_.mu (never the other way)

  bool params_dirty_ GUARDED_BY(ctx_.mu) = false;  // WriteParams since the last commit
  int acquired_ GUARDED_BY(ctx_.mu) = -1;          // access currently acquired
  bool grads_submitted_ GUARDED_BY(ctx_.mu) = false;
  // The last step clipped or was skipped (Speculation::kAuto then waits for the norm).
  bool last_step_clipped_ GUARDED_BY(ctx_.mu) = false;
  // The last step's updates deferred to run under the next (HostPlan::deferred); the step
  // commits once they are written.
  std::vector<int> pending_blocks_ GUARDED_BY(ctx_.mu);
  UpdateArgs pending_args_ GUARDED_BY(ctx_.mu);
  // Each step's statistics, final when it commits (TakeCommittedStats).
  StatsLedger ledger_ GUARDED_BY(ctx_.mu);
  Clock::time_point step_start_;  // the model's thread only
};

}  // namespace strata::engine_internal
