// RankCollectives: what the host-memory and device-memory collectives share — the step's
// fixed sequence of collectives, the comm thread that issues it, the watcher that waits
// for each issued collective in order, and the last item, the all-gather of the ranks'
// gradient-norm parts (on the host communicator), which the optimizer stage combines.
// The subclasses issue the gathers and reduce-scatters in their memory.
//
// The watcher's waiting is what enforces the timeout on NCCL, whose handles abort the
// communicator when it passes: a dead peer then ends the step with an error instead of
// leaving device work waiting forever.
//
// Threads: the comm thread (RunItem), the watcher (WatchLoop); the hooks of Collectives
// from the feeder, the lander and the model's thread.
// Lock: the fields are guarded by the shared EngineContext::mu; collectives are issued
// with it held where they only enqueue (host memory) or with it dropped (device memory,
// which records events). The sequence is written by BeginStep only (like the host plan).
#pragma once

#include <deque>
#include <thread>
#include <vector>

#include "engine/collectives.h"

namespace strata::engine_internal {

class RankCollectives : public Collectives {
 public:
  Status Init() override;
  void JoinCommThread() override;
  void JoinWatcher() override;
  void Detach() override;
  void BeginStepLocked() override REQUIRES(ctx_.mu);
  bool StepDoneLocked() const override REQUIRES(ctx_.mu) { return comm_pos_ == seq_.size(); }
  bool CombinesNorm() const override { return true; }
  Status AllGatherHost(const float* shard, float* all, uint64_t n,
                       const std::string& label) const override;

 protected:
  // `gather_waits_for_grad_frees`: a gather of a load waits for the feeder to free the
  // gradient buffers before it (device memory: its shard's H2D copy comes after them).
  RankCollectives(EngineContext& ctx, HostTier& host, DeviceTier& device, OptimizerStage& optimizer,
                  bool gather_waits_for_grad_frees)
      : Collectives(ctx),
        host_(host),
        device_(device),
        optimizer_(optimizer),
        gather_waits_for_grad_frees_(gather_waits_for_grad_frees) {}

  // Issue the item's collective (the comm thread, mu held; it may wait, and drop mu).
  virtual Status IssueGatherLocked(const CommItem& item) REQUIRES(ctx_.mu) = 0;
  virtual Status IssueReduceLocked(const CommItem& item) REQUIRES(ctx_.mu) = 0;
  // Hands an issued collective to the watcher.
  void WatchLocked(const CommHandle& h) REQUIRES(ctx_.mu) {
    watch_.push_back(h);
    ctx_.NotifyLocked();
  }

  HostTier& host_;
  DeviceTier& device_;
  OptimizerStage& optimizer_;
  // Per access of the open step.
  std::vector<bool> ag_issued_ GUARDED_BY(ctx_.mu);  // the all-gather of its params
  std::vector<CommHandle> ag_handle_ GUARDED_BY(ctx_.mu);
  // What the reduce-scatter waits for (set: it may be issued): the compute that wrote the
  // gradient (device memory) or its D2H copy (host memory).
  std::vector<EventPtr> rs_after_ GUARDED_BY(ctx_.mu);
  std::vector<bool> rs_issued_ GUARDED_BY(ctx_.mu);
  std::vector<CommHandle> rs_handle_ GUARDED_BY(ctx_.mu);

 private:
  void BuildSequence();
  Status RunItem(size_t i) EXCLUDES(ctx_.mu);
  Status CombineNormLocked() REQUIRES(ctx_.mu);
  void WatchLoop() EXCLUDES(ctx_.mu);
  void OnCommOp(const CommOpRecord& r);

  const bool gather_waits_for_grad_frees_;
  std::vector<CommItem> seq_;
  size_t comm_pos_ GUARDED_BY(ctx_.mu) = 0;           // items of seq_ issued (or finished: kNorm)
  std::deque<CommHandle> watch_ GUARDED_BY(ctx_.mu);  // issued, not yet waited for
  std::thread comm_thread_, watch_thread_;
};

// The two implementations with ranks (collectives_host.cc, collectives_device.cc).
std::unique_ptr<Collectives> CreateHostMemoryCollectives(EngineContext& ctx, HostTier& host,
                                                         DeviceTier& device,
                                                         OptimizerStage& optimizer);
std::unique_ptr<Collectives> CreateDeviceMemoryCollectives(EngineContext& ctx, HostTier& host,
                                                           DeviceTier& device,
                                                           OptimizerStage& optimizer);

}  // namespace strata::engine_internal
