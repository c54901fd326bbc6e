// Collectives in pinned host memory (see collectives.h): two full-block parameter gather
// buffers and one full-block gradient landing buffer (the reduce-scatter's input), all in
// the pinned pool.
#include "engine/rank_collectives.h"

namespace strata::engine_internal {
namespace {

class HostMemoryCollectives final : public RankCollectives {
 public:
  HostMemoryCollectives(EngineContext& ctx, HostTier& host, DeviceTier& device,
                        OptimizerStage& optimizer)
      : RankCollectives(ctx, host, device, optimizer, /*gather_waits_for_grad_frees=*/false) {}

  Status AllocateBuffers() override {
    const PlacementPlan& place = ctx_.place;
    for (void*& g : gather_) {
      STRATA_ASSIGN_OR_RETURN(g, host_.Allocate(place.gather_bytes, "param gather"));
    }
    STRATA_ASSIGN_OR_RETURN(grad_full_,
                            host_.Allocate(place.comm_staging_bytes - 2 * place.gather_bytes,
                                           "grad landing (reduce-scatter input)"));
    return Status::OK();
  }

  void BeginStepLocked() override REQUIRES(ctx_.mu) {
    RankCollectives::BeginStepLocked();
    const size_t n = ctx_.schedule.size();
    gather_busy_[0] = gather_busy_[1] = false;
    ag_slot_.assign(n, 0);
    rs_dst_.assign(n, nullptr);
  }

  // The comm thread entered the shard and issued its all-gather into a gather buffer; the
  // H2D lane waits for the gather, copies the full block, then frees both.
  Result<EventPtr> FillParams(int a, void* dst) override {
    const int obj = ctx_.hplan.uses[ctx_.hplan.h2d_use[a]].objs[0].obj;
    const int b = ctx_.schedule[a].block;
    CommHandle gathered;
    int slot;
    {
      MutexLock lock(&ctx_.mu);
      STRATA_RETURN_IF_ERROR(
          ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return bool(ag_issued_[a]); }));
      gathered = ag_handle_[a];
      slot = ag_slot_[a];
    }
    Device* dev = ctx_.dev;
    STRATA_RETURN_IF_ERROR(dev->EnqueueHostFunction(
        Lane::kH2D,
        [this, gathered] {
          Status st = gathered.Wait();
          if (!st.ok()) ctx_.SetError(st);
          return st;
        },
        "wait all-gather"));
    STRATA_RETURN_IF_ERROR(
        dev->CopyToDevice(dst, gather_[slot], ctx_.param_bytes[b], "h2d " + ctx_.layout[b].name));
    STRATA_RETURN_IF_ERROR(dev->EnqueueHostFunction(
        Lane::kH2D,
        [this, obj, slot] {
          MutexLock lock(&ctx_.mu);
          gather_busy_[slot] = false;
          return host_.LeaveLocked(obj, false);
        },
        "h2d done"));
    return dev->Record(Lane::kH2D);
  }

  // The full block lands in grad_full_; the reduce-scatter (ordered after this copy)
  // averages it over the ranks into `dst`. The D2H lane waits for it before accumulating,
  // which also keeps the next landing out of grad_full_ until it is read. The device
  // buffer is free once copied out: freeing it must not wait for the reduce-scatter (which
  // may be ordered after the next gathers, whose H2D copies wait for device memory).
  // bf16 gradients (GradDtype::kBf16): half the bytes cross, and are widened in place on the
  // D2H lane before the reduce-scatter, which sums the ranks' bf16-rounded gradients in fp32.
  Result<EventPtr> LandGrad(int a, const void* src, void* dst, const EventPtr& computed) override {
    const int b = ctx_.schedule[a].block;
    const bool bf16 = ctx_.opt.grad_dtype == GradDtype::kBf16;
    Device* dev = ctx_.dev;
    STRATA_RETURN_IF_ERROR(dev->WaitEvent(Lane::kD2H, computed));
    STRATA_RETURN_IF_ERROR(dev->CopyToHost(grad_full_, src, ctx_.grad_bytes[b] / (bf16 ? 2 : 1),
                                           "d2h grad " + ctx_.layout[b].name));
    if (bf16) {
      STRATA_RETURN_IF_ERROR(EnqueueWidenBf16Grad(*dev, grad_full_, ctx_.layout[b].padded_numel));
    }
    STRATA_ASSIGN_OR_RETURN(EventPtr copied, dev->Record(Lane::kD2H));
    {
      MutexLock lock(&ctx_.mu);
      rs_dst_[a] = dst;
      rs_after_[a] = copied;
      ctx_.NotifyLocked();
    }
    STRATA_RETURN_IF_ERROR(dev->EnqueueHostFunction(
        Lane::kD2H,
        [this, a] {
          CommHandle reduced;
          {
            MutexLock lock(&ctx_.mu);
            STRATA_RETURN_IF_ERROR(
                ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return bool(rs_issued_[a]); }));
            reduced = rs_handle_[a];
          }
          Status st = reduced.Wait();
          if (!st.ok()) ctx_.SetError(st);
          return st;
        },
        "wait reduce-scatter"));
    return copied;
  }

 protected:
  Status IssueGatherLocked(const CommItem& item) override REQUIRES(ctx_.mu) {
    const int a = item.access;
    const UseObj uo = ctx_.hplan.uses[ctx_.hplan.h2d_use[a]].objs[0];
    STRATA_RETURN_IF_ERROR(ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) {
      return !gather_busy_[item.slot] && host_.UsableLocked(uo.obj, uo.seq);
    }));
    STRATA_RETURN_IF_ERROR(host_.EnterLocked(uo.obj));
    gather_busy_[item.slot] = true;
    const int b = ctx_.schedule[a].block;
    const std::string label = "all-gather " + ctx_.layout[b].name;
    CollectiveOptions co;
    co.label = label;
    // Bytes: the working dtype's shard (fp32 or bf16), no arithmetic.
    const HostObj& h = host_.Obj(uo.obj);
    ag_handle_[a] =
        ctx_.comm->AllGather(h.buf, gather_[item.slot], h.bytes, CommDataType::kByte, co);
    WatchLocked(ag_handle_[a]);
    ag_slot_[a] = item.slot;
    ag_issued_[a] = true;
    return Status::OK();
  }

  Status IssueReduceLocked(const CommItem& item) override REQUIRES(ctx_.mu) {
    const int a = item.access;
    STRATA_RETURN_IF_ERROR(
        ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return rs_after_[a] != nullptr; }));
    const int b = ctx_.schedule[a].block;
    const std::string label = "reduce-scatter " + ctx_.layout[b].name;
    CollectiveOptions co;
    co.label = label;
    co.after = rs_after_[a];
    // Every rank's loss is the mean over its rows: the global gradient is the average.
    rs_handle_[a] = ctx_.comm->ReduceScatter(grad_full_, rs_dst_[a], ctx_.layout[b].shard_numel,
                                             CommDataType::kFloat32, ReduceOp::kAverage, co);
    WatchLocked(rs_handle_[a]);
    rs_issued_[a] = true;
    return Status::OK();
  }

 private:
  void* gather_[2] = {nullptr, nullptr};
  void* grad_full_ = nullptr;
  bool gather_busy_[2] GUARDED_BY(ctx_.mu) = {false, false};
  std::vector<int> ag_slot_ GUARDED_BY(ctx_.mu);
  // Where the reduce-scatter writes this rank's shard.
  std::vector<void*> rs_dst_ GUARDED_BY(ctx_.mu);
};

}  // namespace

std::unique_ptr<Collectives> CreateHostMemoryCollectives(EngineContext& ctx, HostTier& host,
                                                         DeviceTier& device,
                                                         OptimizerStage& optimizer) {
  return std::make_unique<HostMemoryCollectives>(ctx, host, device, optimizer);
}

}  // namespace strata::engine_internal
