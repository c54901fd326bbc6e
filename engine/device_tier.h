// DeviceTier: the device buffers of the open step and the two threads that move data
// between pinned host memory and the device. It owns the buffers of the device plan (each
// with its residency and the events that order work around it), the device memory
// accounting, and the queue of submitted gradients.
//  - The feeder runs the device plan in order: frees evicted buffers once the work that
//    used them finished, allocates, and has the collectives fill each loaded block's
//    parameter buffer (an H2D copy, or a gather).
//  - The lander enqueues each submitted gradient's D2H copy (through the collectives) and
//    the fp32 accumulation after it, on the D2H lane, once its host accumulator is placed,
//    so SubmitGrads never blocks the model on host memory.
//
// Threads: the model's thread calls the *Params/*Grad* methods (through the coordinator);
// the feeder and lander threads run here; the collectives' comm thread reads buffer
// pointers and sets the ready event of a buffer it gathers into.
// Lock: the fields are guarded by the shared EngineContext::mu; device calls are made
// without it.
#pragma once

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "engine/engine_context.h"
#include "engine/host_tier.h"
#include "engine/optimizer_stage.h"
#include "engine/residency.h"

namespace strata::engine_internal {

class Collectives;

// One buffer of the device plan.
struct DevBuf {
  void* ptr = nullptr;
  // Params: kLoading (fill enqueued) -> kReady -> kInUse (Acquire .. Release) -> kReady.
  // Gradients: kReady (allocated) -> kInUse (submitted, until its D2H copy is enqueued).
  Residency res;
  EventPtr ready;        // params: the fill is done (later device work orders itself after it)
  EventPtr last;         // the last work that used it (compute after Release; D2H for grads)
  int last_access = -1;  // the last access of the plan that uses it
};

class DeviceTier {
 public:
  DeviceTier(EngineContext& ctx, HostTier& host, OptimizerStage& optimizer)
      : ctx_(ctx), host_(host), optimizer_(optimizer) {}
  DeviceTier(const DeviceTier&) = delete;
  DeviceTier& operator=(const DeviceTier&) = delete;
  void SetCollectives(Collectives* collectives) { collectives_ = collectives; }

  void Start();
  void JoinLander() {
    if (lander_thread_.joinable()) lander_thread_.join();
  }
  void JoinFeeder() {
    if (feeder_thread_.joinable()) feeder_thread_.join();
  }
  // Frees every buffer (EndStep and shutdown, with the device's lanes idle). Returns the
  // first failure.
  Status FreeAll() EXCLUDES(ctx_.mu);

  void BeginStepLocked() REQUIRES(ctx_.mu);
  // The feeder ran the plan and the lander is done with every submitted gradient (its
  // last bookkeeping may trail the landing's completion on the D2H lane).
  bool StepDoneLocked() const REQUIRES(ctx_.mu) {
    return feeder_pos_ == int(ctx_.schedule.size()) && landings_pending_ == 0;
  }
  int model_pos() const REQUIRES(ctx_.mu) { return model_pos_; }
  uint64_t PeakBytesLocked() const REQUIRES(ctx_.mu) { return dev_peak_; }

  // ---- The model's accesses (coordinator, mu held). ----
  // The feeder has prepared access `a`.
  bool FedLocked(int a) const REQUIRES(ctx_.mu) { return feeder_pos_ > a; }
  // The model starts access `a`: returns the event compute must wait for (may be null).
  Result<EventPtr> EnterParamsLocked(int a) REQUIRES(ctx_.mu);
  void* ParamsLocked(int a) const REQUIRES(ctx_.mu) {
    return dbufs_[ctx_.dplan.steps[a].param_buffer].ptr;
  }
  float* GradLocked(int a) const REQUIRES(ctx_.mu) {
    return static_cast<float*>(dbufs_[ctx_.dplan.steps[a].grad_buffer].ptr);
  }
  // The model ends access `a`; `last` is the compute that used its buffers.
  Status ReleaseLocked(int a, EventPtr last) REQUIRES(ctx_.mu);
  // The model submitted access `a`'s gradient, written by `computed`: queue its landing.
  // `sources` (Engine::SubmitGradsFrom; empty: the gradient buffer) are per-tensor addresses
  // adopted by the device; they are forgotten, and `ticket` marked read, once copied.
  Status SubmitLocked(int a, EventPtr computed, std::vector<const float*> sources = {},
                      uint64_t ticket = 0) REQUIRES(ctx_.mu);
  // The next ticket of a SubmitGradsFrom, and the last one whose sources were read.
  uint64_t NextTicketLocked() REQUIRES(ctx_.mu) { return ++tickets_issued_; }
  uint64_t TicketsRead() const { return tickets_read_.load(std::memory_order_acquire); }

  // ---- For the collectives. ----
  // Copies this rank's shard of the block's params (one rank: the whole block) from its
  // host copy into its slot of `dst`, once the host copy is usable; returns the copy's event.
  Result<EventPtr> CopyShardToDevice(int a, void* dst) EXCLUDES(ctx_.mu);
  void* BufferLocked(int id) const REQUIRES(ctx_.mu) { return dbufs_[id].ptr; }
  void SetReadyLocked(int id, EventPtr ready) REQUIRES(ctx_.mu) {
    dbufs_[id].ready = std::move(ready);
  }

 private:
  struct Landing {
    int access = 0;
    EventPtr computed;                  // the compute that wrote the gradient
    std::vector<const float*> sources;  // per tensor, or empty: the gradient buffer
    uint64_t ticket = 0;
  };
  Status RunFeederAccess(int a) EXCLUDES(ctx_.mu);
  Status FreeBuffer(int id) EXCLUDES(ctx_.mu);
  Status AllocateBuffer(int id) EXCLUDES(ctx_.mu);
  void LanderLoop() EXCLUDES(ctx_.mu);
  Status RunLanding(const Landing& l) EXCLUDES(ctx_.mu);
  // Enqueues, on the D2H lane after the landed copy, the fp32 accumulation of a
  // micro-batch after the first and the zeroing of the padding.
  Status EnqueueAccumulate(int obj, bool first, int block) EXCLUDES(ctx_.mu);
  // One rank's landing from the caller's tensors (SubmitGradsFrom): a copy per tensor into
  // `dst` at its offset (zeros for a null source), then, on the D2H lane, the sources are
  // forgotten and the ticket marked read.
  Status CopySourcesToHost(const Landing& l, float* dst) EXCLUDES(ctx_.mu);

  EngineContext& ctx_;
  HostTier& host_;
  OptimizerStage& optimizer_;
  Collectives* collectives_ = nullptr;
  std::vector<DevBuf> dbufs_ GUARDED_BY(ctx_.mu);
  uint64_t dev_used_ GUARDED_BY(ctx_.mu) = 0;
  uint64_t dev_peak_ GUARDED_BY(ctx_.mu) = 0;
  int model_pos_ GUARDED_BY(ctx_.mu) = 0;             // accesses released by the model
  int feeder_pos_ GUARDED_BY(ctx_.mu) = 0;            // accesses prepared by the feeder
  std::deque<Landing> landings_ GUARDED_BY(ctx_.mu);  // submitted, waiting for their D2H
  int landings_pending_ GUARDED_BY(ctx_.mu) = 0;      // submitted, the lander not done
  uint64_t tickets_issued_ GUARDED_BY(ctx_.mu) = 0;   // SubmitGradsFrom calls so far
  std::atomic<uint64_t> tickets_read_{0};             // their sources copied (in order)
  std::thread feeder_thread_, lander_thread_;
};

}  // namespace strata::engine_internal
