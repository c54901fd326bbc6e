// Collectives: what the step does across ranks, behind one interface with three
// implementations, chosen at Create from EngineOptions::comm and collective_memory:
//   none    one rank without a communicator: plain H2D/D2H copies, the norm combined
//           locally (collectives.cc);
//   host    collectives in pinned host memory: the all-gather fills a full-block gather
//           buffer as soon as the shard is in host memory, and the H2D lane copies the
//           whole block after it; the D2H copy lands the whole gradient in a pinned buffer,
//           the reduce-scatter (after that copy) averages it into this rank's shard, and
//           the accumulation waits for it (collectives_host.cc);
//   device  collectives in device memory: the feeder copies this rank's shard into its
//           slot of the block's device buffer; the all-gather fills the other slots in
//           place on Lane::kComm, and compute waits for it by an event. The reduce-scatter
//           averages the gradient in place (after the compute that wrote it); the lander
//           copies this rank's shard back after it (collectives_device.cc).
// With ranks, a comm thread issues every collective of the step in an order fixed at
// BeginStep from the schedule and the plans (the same on every rank, since collectives
// match by order), and a watcher waits for each one in order and stores the first failure
// (rank_collectives.h).
//
// Threads: FillParams runs on the feeder, LandGrad on the lander, the *Locked hooks on the
// model's thread (through the coordinator); AllGatherHost between steps.
// Lock: implementations keep their state under the shared EngineContext::mu.
#pragma once

#include <memory>

#include "engine/device_tier.h"
#include "engine/engine_context.h"
#include "engine/host_tier.h"
#include "engine/optimizer_stage.h"

namespace strata::engine_internal {

class Collectives {
 public:
  virtual ~Collectives() = default;
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  // Init, right after the host tier's pool is created: the implementation's pinned buffers.
  virtual Status AllocateBuffers() { return Status::OK(); }
  // Init, last: the observers and threads.
  virtual Status Init() { return Status::OK(); }
  // Shutdown, in the engine's order: the comm thread (with the other step workers), then
  // the watcher (before the device's lanes drain), then every issued collective is waited
  // for and the observers removed.
  virtual void JoinCommThread() {}
  virtual void JoinWatcher() {}
  virtual void Detach() {}

  // BeginStep, once the host plan is fixed.
  virtual void BeginStepLocked() REQUIRES(ctx_.mu) {}
  // Every collective of the step is issued (and the norm combined).
  virtual bool StepDoneLocked() const REQUIRES(ctx_.mu) { return true; }
  // Whether the ranks' gradient norm is combined here (else the optimizer stage does it).
  virtual bool CombinesNorm() const { return false; }

  // Feeder: fills the device buffer `dst` of load access `a` with the block's parameters.
  // Returns the event compute must wait for, or null when MayUseParamsLocked's gather sets
  // the buffer's ready event itself.
  virtual Result<EventPtr> FillParams(int a, void* dst) = 0;
  // Acquire: the model may start access `a` once this holds (and the feeder prepared it).
  virtual bool MayUseParamsLocked(int /*a*/) const REQUIRES(ctx_.mu) { return true; }
  // SubmitGrads: `computed` wrote the gradient of access `a`.
  virtual void GradComputedLocked(int /*a*/, const EventPtr& /*computed*/) REQUIRES(ctx_.mu) {}
  // Lander: enqueues on the D2H lane (after `computed`) what lands this rank's shard of
  // access `a`'s gradient from the device buffer `src` into the pinned `dst`. Returns the
  // event after which the device buffer may be freed, or null: after the landing.
  virtual Result<EventPtr> LandGrad(int a, const void* src, void* dst,
                                    const EventPtr& computed) = 0;
  // Between steps: every rank's `n` floats at `shard`, in rank order, into `all`.
  virtual Status AllGatherHost(const float* shard, float* all, uint64_t n,
                               const std::string& label) const = 0;

 protected:
  explicit Collectives(EngineContext& ctx) : ctx_(ctx) {}
  EngineContext& ctx_;
};

std::unique_ptr<Collectives> CreateCollectives(EngineContext& ctx, HostTier& host,
                                               DeviceTier& device, OptimizerStage& optimizer);

// GradDtype::kBf16: enqueues on the D2H lane (after the copy that landed them) the widening,
// in place, of the `n` bf16 values packed at the start of the pinned fp32 buffer `buf` into
// `n` floats, so that what reads the buffer after it on that lane (the accumulation, or the
// reduce-scatter ordered after an event recorded there) sees fp32. Fails as
// Device::EnqueueHostFunction.
Status EnqueueWidenBf16Grad(Device& dev, void* buf, uint64_t n);

// At Create, with ranks: every rank must pass the same options (they fix the order of the
// collectives, and other optimizer settings would silently diverge).
Status CheckOptionsAgreeAcrossRanks(const EngineContext& ctx);

}  // namespace strata::engine_internal
