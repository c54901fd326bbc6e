// Collectives in device memory (see collectives.h): in place in the blocks' device
// buffers, on Lane::kComm. A host communicator (Gloo on a HostDevice) completes on its own
// thread, so a host function on Lane::kComm waits for it; NCCL runs on that lane's stream.
#include "engine/rank_collectives.h"

namespace strata::engine_internal {
namespace {

class DeviceMemoryCollectives final : public RankCollectives {
 public:
  DeviceMemoryCollectives(EngineContext& ctx, HostTier& host, DeviceTier& device,
                          OptimizerStage& optimizer)
      : RankCollectives(ctx, host, device, optimizer, /*gather_waits_for_grad_frees=*/true) {}

  void BeginStepLocked() override REQUIRES(ctx_.mu) {
    RankCollectives::BeginStepLocked();
    const size_t n = ctx_.schedule.size();
    shard_h2d_.assign(n, nullptr);
    rs_done_.assign(n, nullptr);
  }

  // The feeder copies this rank's shard into its slot; the gather (issued after that copy)
  // fills the others and sets the buffer's ready event.
  Result<EventPtr> FillParams(int a, void* dst) override {
    STRATA_ASSIGN_OR_RETURN(EventPtr copied, device_.CopyShardToDevice(a, dst));
    MutexLock lock(&ctx_.mu);
    shard_h2d_[a] = std::move(copied);
    ctx_.NotifyLocked();
    return EventPtr();
  }

  // The block is ready once its all-gather is issued too.
  bool MayUseParamsLocked(int a) const override REQUIRES(ctx_.mu) {
    return !ctx_.dplan.steps[a].load || ag_issued_[a];
  }

  // The reduce-scatter may start after the compute that wrote the gradient.
  void GradComputedLocked(int a, const EventPtr& computed) override REQUIRES(ctx_.mu) {
    rs_after_[a] = computed;
  }

  // The copy takes this rank's shard of the averaged gradient, after the reduce-scatter.
  Result<EventPtr> LandGrad(int a, const void* src, void* dst, const EventPtr&) override {
    const int b = ctx_.schedule[a].block;
    EventPtr after;
    {
      MutexLock lock(&ctx_.mu);
      STRATA_RETURN_IF_ERROR(
          ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return bool(rs_issued_[a]); }));
      after = rs_done_[a];
    }
    STRATA_RETURN_IF_ERROR(ctx_.dev->WaitEvent(Lane::kD2H, after));
    const uint64_t bytes = ctx_.layout[b].shard_numel * 4;
    const char* shard = static_cast<const char*>(src) + uint64_t(ctx_.rank) * bytes;
    STRATA_RETURN_IF_ERROR(
        ctx_.dev->CopyToHost(dst, shard, bytes, "d2h grad " + ctx_.layout[b].name));
    return EventPtr();
  }

 protected:
  // In place: this rank's slot (copied by the feeder) to every rank's.
  Status IssueGatherLocked(const CommItem& item) override REQUIRES(ctx_.mu) {
    const int a = item.access;
    const int b = ctx_.schedule[a].block;
    STRATA_RETURN_IF_ERROR(
        ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return shard_h2d_[a] != nullptr; }));
    const int id = ctx_.dplan.steps[a].param_buffer;
    char* block = static_cast<char*>(device_.BufferLocked(id));
    const uint64_t n = ctx_.param_bytes[b] / uint64_t(ctx_.ws);
    const std::string label = "all-gather " + ctx_.layout[b].name;
    CollectiveOptions co;
    co.label = label;
    co.after = shard_h2d_[a];
    ctx_.mu.Unlock();
    CommHandle h =
        ctx_.comm->AllGather(block + uint64_t(ctx_.rank) * n, block, n, CommDataType::kByte, co);
    Result<EventPtr> done = DoneEvent(h, label);
    ctx_.mu.Lock();
    WatchLocked(h);
    if (!done.ok()) return done.status();
    device_.SetReadyLocked(id, *done);
    ag_handle_[a] = h;
    ag_issued_[a] = true;
    return Status::OK();
  }

  // In place: the average of every rank's gradient, this rank's shard at its slot.
  Status IssueReduceLocked(const CommItem& item) override REQUIRES(ctx_.mu) {
    const int a = item.access;
    const int b = ctx_.schedule[a].block;
    STRATA_RETURN_IF_ERROR(
        ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return rs_after_[a] != nullptr; }));
    float* grad = device_.GradLocked(a);
    const uint64_t n = ctx_.layout[b].shard_numel;
    const std::string label = "reduce-scatter " + ctx_.layout[b].name;
    CollectiveOptions co;
    co.label = label;
    co.after = rs_after_[a];
    ctx_.mu.Unlock();
    CommHandle h = ctx_.comm->ReduceScatter(grad, grad + uint64_t(ctx_.rank) * n, n,
                                            CommDataType::kFloat32, ReduceOp::kAverage, co);
    Result<EventPtr> done = DoneEvent(h, label);
    ctx_.mu.Lock();
    WatchLocked(h);
    if (!done.ok()) return done.status();
    rs_done_[a] = *done;
    rs_handle_[a] = h;
    rs_issued_[a] = true;
    return Status::OK();
  }

 private:
  // An event on Lane::kComm that completes with collective `h`.
  Result<EventPtr> DoneEvent(const CommHandle& h, const std::string& label) {
    if (!ctx_.comm->device_buffers()) {
      // A host communicator completes on its own worker: the lane waits for it there.
      STRATA_RETURN_IF_ERROR(ctx_.dev->EnqueueHostFunction(
          Lane::kComm, [h] { return h.Wait(); }, "wait " + label));
    }
    // A device communicator (NCCL) runs on this lane's stream: the event follows it.
    return ctx_.dev->Record(Lane::kComm);
  }

  // The H2D copy of this rank's shard (set: enqueued).
  std::vector<EventPtr> shard_h2d_ GUARDED_BY(ctx_.mu);
  // Lane::kComm event after the reduce-scatter.
  std::vector<EventPtr> rs_done_ GUARDED_BY(ctx_.mu);
};

}  // namespace

std::unique_ptr<Collectives> CreateDeviceMemoryCollectives(EngineContext& ctx, HostTier& host,
                                                           DeviceTier& device,
                                                           OptimizerStage& optimizer) {
  return std::make_unique<DeviceMemoryCollectives>(ctx, host, device, optimizer);
}

}  // namespace strata::engine_internal
