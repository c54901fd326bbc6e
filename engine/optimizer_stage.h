// OptimizerStage: the step's gradient norm, clipping and AdamW update. It owns the per-block
// gradient state (landings counted, squared norms, non-finite counts), the combined norm
// and clip coefficient, and the optimizer thread, which runs the blocks' AdamW steps in the
// host plan's order, each as soon as its gradient is final and its states are loaded,
// computing each final gradient's squared norm while it waits.
//
// The norm is combined in one place, FinalizeNormLocked: this rank's part is the sum of the
// blocks' squared norms in block order (the sum does not depend on which gradient landed
// first); the parts of the ranks are summed in rank order (every rank gets the same norm
// bit for bit). With one rank the optimizer thread combines it (when clipping needs it
// before the updates) or EndStep does; with ranks, the collectives' last item gathers the
// parts and combines them (ranks_combine_norm).
//
// Speculation (EngineOptions::speculation): with clipping, when the step is speculative
// (EngineContext::speculative) a restorable block's update runs as soon as its gradient is
// final, with the scale of a step that does not clip; SpeculativeBlocksLocked names them,
// and EndStep redoes them (HostTier::RollBackLocked with ApplyAdamW) when the norm shows
// that clipping or a non-finite gradient applies. A redo runs the same kernel with the same
// arguments as the update that waits for the norm, so the result is bit-identical.
//
// Lock: the fields are guarded by the shared EngineContext::mu. The norm and AdamW kernels
// run without it, on buffers the host tier keeps entered for them.
#pragma once

#include <span>
#include <thread>
#include <vector>

#include "engine/engine_context.h"
#include "engine/host_tier.h"

namespace strata::engine_internal {

// One rank's part of the gradient norm (exact doubles: gathered as bytes across ranks).
struct NormPart {
  double sum_squares = 0;
  uint64_t non_finite = 0;
};

// The step's combined norm, as StepStats reports it.
struct GradNormResult {
  double grad_norm = 0;
  double clip_coef = 1;
  bool skipped = false;  // a gradient (or the norm) is not finite: no update may stand
};

// Block `b`'s AdamW step over this rank's part of each tensor, on its host copies
// (`bufs[component]`; kParam may be null).
Status ApplyAdamW(const EngineContext& ctx, int b, const BlockBuffers& bufs,
                  const UpdateArgs& args);
// The arguments of the open step's updates once the norm is known (nullptr: of one that
// assumes no clipping).
UpdateArgs StepUpdateArgs(const EngineContext& ctx, const GradNormResult* norm);

class OptimizerStage {
 public:
  OptimizerStage(EngineContext& ctx, HostTier& host, bool ranks_combine_norm)
      : ctx_(ctx), host_(host), ranks_combine_norm_(ranks_combine_norm) {}
  OptimizerStage(const OptimizerStage&) = delete;
  OptimizerStage& operator=(const OptimizerStage&) = delete;

  void Start() {
    thread_ = std::thread([this] {
      // With deferred updates, a last item computes the norms nobody else needed.
      ctx_.RunStepWorker(
          [this] { return ctx_.hplan.opt_uses.size() + (ctx_.hplan.deferred.empty() ? 0 : 1); },
          [this](size_t k) {
            return k < ctx_.hplan.opt_uses.size() ? RunUpdate(ctx_.hplan.opt_uses[k])
                                                  : ComputeNorms();
          });
    });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  void BeginStepLocked() REQUIRES(ctx_.mu);
  // Every update ran, and the previous step (whose updates this one carried) is committed.
  bool StepDoneLocked() const REQUIRES(ctx_.mu) {
    return opts_done_ == ctx_.hplan.opt_uses.size() && carry_committed_ && norms_done_;
  }
  // The previous step's commit has landed (or there was none to wait for); and when it did.
  // With ranks: its updates' writes have landed (EndStep then commits it, a collective).
  bool CarryCommittedLocked() const REQUIRES(ctx_.mu) { return carry_committed_; }
  // Every carried update ran: the previous step's commit waits only for their writes.
  bool CarriedAppliedLocked() const REQUIRES(ctx_.mu) { return carried_left_ == 0; }
  Clock::time_point CarryCommitTimeLocked() const REQUIRES(ctx_.mu) { return carry_commit_time_; }
  // The lander: one more micro-batch's gradient of `block` accumulated; true when it was the
  // last (the gradient is final).
  bool GradLandedLocked(int block) REQUIRES(ctx_.mu) {
    return ++grads_in_[block] == ctx_.opt.micro_batches;
  }

  // The norm.
  bool AllNormsKnownLocked() const REQUIRES(ctx_.mu);
  // This rank's part: the blocks' sums in block order. REQUIRES: AllNormsKnownLocked().
  NormPart LocalNormPartLocked() const REQUIRES(ctx_.mu);
  // Combines the ranks' parts (in rank order) into the step's norm and clip coefficient.
  void FinalizeNormLocked(std::span<const NormPart> parts) REQUIRES(ctx_.mu);
  // At EndStep: the step's norm (combined now if nothing needed it before).
  GradNormResult NormLocked() REQUIRES(ctx_.mu);
  // Blocks whose AdamW step was applied this step. Without clipping an update starts once
  // its own gradient and every gradient landed before it are known finite, before the
  // global norm: a non-finite gradient that lands later leaves the step partly applied,
  // which EndStep refuses to commit.
  int AppliedLocked() const REQUIRES(ctx_.mu) { return applied_; }
  // Blocks updated this step before the norm was known, assuming no clipping.
  std::vector<int> SpeculativeBlocksLocked() const REQUIRES(ctx_.mu);
  // EndStep undid `blocks` updates (a skipped step): they no longer count as applied.
  void UndoneLocked(int blocks) REQUIRES(ctx_.mu) { applied_ -= blocks; }

 private:
  // The AdamW step of host use `use_index` (one block).
  Status RunUpdate(int use_index) EXCLUDES(ctx_.mu);
  // Waits until the update of `u` may run, computing final gradients' norms meanwhile.
  Status WaitForUpdateLocked(const HostUse& u) REQUIRES(ctx_.mu);
  // Computes the squared norm of one final gradient whose norm is unknown; false when
  // there is none.
  Result<bool> ComputeOneNormLocked() REQUIRES(ctx_.mu);
  // Waits until ready() holds (checked with the lock held), computing final gradients'
  // norms meanwhile.
  template <class Pred>
  Status WaitComputingNormsLocked(Pred ready) REQUIRES(ctx_.mu);
  Status AdamBlock(int block, bool carried, bool* applied) EXCLUDES(ctx_.mu);
  // After block b's update: a master weight that came out non-finite (e.g. --eps 0 with a
  // zero second moment) is never committed. A step whose updated blocks can all be rolled
  // back from the last commit is skipped whole (as a non-finite gradient's is, and counted
  // so); otherwise the engine stops with the step uncommitted (Aborted).
  Status CheckUpdateFiniteLocked(int b, bool carried, uint64_t non_finite) REQUIRES(ctx_.mu);
  // Every final gradient's norm, and the step's (one rank), for a step whose updates are
  // deferred to the next.
  Status ComputeNorms() EXCLUDES(ctx_.mu);
  // A carried update (HostUse::carried) may run once its states are in memory.
  Status WaitForCarriedLocked(const HostUse& u) REQUIRES(ctx_.mu);
  // After the last carried update: once its writes landed, commits the previous step.
  Status CommitCarriedLocked() REQUIRES(ctx_.mu);
  // The update of `b` may run now: its gradient and states are ready, and with clipping
  // the norm is known or the step speculates on `b`.
  bool NormAllowsUpdateLocked(int b) REQUIRES(ctx_.mu);

  EngineContext& ctx_;
  HostTier& host_;
  const bool ranks_combine_norm_;
  std::vector<int> grads_in_ GUARDED_BY(ctx_.mu);  // gradient landings completed per block
  std::vector<double> norm_sq_ GUARDED_BY(ctx_.mu);
  std::vector<uint64_t> non_finite_ GUARDED_BY(ctx_.mu);
  std::vector<bool> norm_known_ GUARDED_BY(ctx_.mu);
  GradNormResult norm_ GUARDED_BY(ctx_.mu);
  bool norm_final_ GUARDED_BY(ctx_.mu) = false;
  size_t opts_done_ GUARDED_BY(ctx_.mu) = 0;
  int applied_ GUARDED_BY(ctx_.mu) = 0;
  std::vector<bool> speculated_ GUARDED_BY(ctx_.mu);    // per block: updated before the norm
  std::vector<bool> updated_ GUARDED_BY(ctx_.mu);       // per block: this step's update ran
  bool update_not_finite_ GUARDED_BY(ctx_.mu) = false;  // an update made a master non-finite
  size_t carried_left_ GUARDED_BY(ctx_.mu) = 0;         // carried updates not yet run
  bool carry_committed_ GUARDED_BY(ctx_.mu) = true;
  bool norms_done_ GUARDED_BY(ctx_.mu) = true;  // ComputeNorms ran, when the step needs it
  Clock::time_point carry_commit_time_ GUARDED_BY(ctx_.mu);
  std::thread thread_;
};

}  // namespace strata::engine_internal
