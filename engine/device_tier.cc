#include "engine/device_tier.h"

#include <cstring>

#include "engine/collectives.h"

namespace strata::engine_internal {

using S = ResidencyState;

void DeviceTier::Start() {
  feeder_thread_ = std::thread([this] {
    ctx_.RunStepWorker([this] { return ctx_.schedule.size(); },
                       [this](size_t a) { return RunFeederAccess(int(a)); });
  });
  lander_thread_ = std::thread([this] { LanderLoop(); });
}

void DeviceTier::BeginStepLocked() {
  dbufs_.assign(ctx_.dplan.buffers.size(), DevBuf{});
  for (int a = 0; a < int(ctx_.schedule.size()); ++a) {
    const DevStep& ds = ctx_.dplan.steps[a];
    dbufs_[ds.param_buffer].last_access = a;
    if (ds.grad_buffer >= 0) dbufs_[ds.grad_buffer].last_access = a;
  }
  dev_used_ = dev_peak_ = 0;
  landings_pending_ = 0;
  model_pos_ = 0;
  feeder_pos_ = 0;
}

Status DeviceTier::FreeAll() {
  std::vector<void*> ptrs;
  {
    MutexLock lock(&ctx_.mu);
    for (DevBuf& d : dbufs_) {
      if (d.ptr) ptrs.push_back(d.ptr);
      d.ptr = nullptr;
    }
    dev_used_ = 0;
  }
  Status first;
  for (void* p : ptrs) {
    Status f = ctx_.dev->Free(p);
    if (first.ok()) first = f;
  }
  return first;
}

// ---------------------------------------------------------------------------------------
// The model's accesses
// ---------------------------------------------------------------------------------------

Result<EventPtr> DeviceTier::EnterParamsLocked(int a) {
  DevBuf& d = dbufs_[ctx_.dplan.steps[a].param_buffer];
  STRATA_RETURN_IF_ERROR(d.res.Enter().Annotate("device params of access " + std::to_string(a)));
  return d.ready;
}

Status DeviceTier::ReleaseLocked(int a, EventPtr last) {
  DevBuf& d = dbufs_[ctx_.dplan.steps[a].param_buffer];
  d.last = std::move(last);
  STRATA_RETURN_IF_ERROR(
      d.res.Leave(false, false).Annotate("device params of access " + std::to_string(a)));
  model_pos_ = a + 1;
  ctx_.NotifyLocked();
  return Status::OK();
}

Status DeviceTier::SubmitLocked(int a, EventPtr computed, std::vector<const float*> sources,
                                uint64_t ticket) {
  // With sources the gradient buffer stays unused but is entered all the same, so the feeder
  // still waits for the landing before reusing its memory: the pending landings, and the
  // caller's memory they hold, stay bounded by the device plan.
  DevBuf& d = dbufs_[ctx_.dplan.steps[a].grad_buffer];
  STRATA_RETURN_IF_ERROR(d.res.Enter().Annotate("device gradient of access " + std::to_string(a)));
  landings_.push_back(Landing{a, std::move(computed), std::move(sources), ticket});
  ++landings_pending_;
  ctx_.NotifyLocked();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// Feeder
// ---------------------------------------------------------------------------------------

Status DeviceTier::FreeBuffer(int f) {
  EventPtr last;
  void* ptr;
  {
    MutexLock lock(&ctx_.mu);
    // No later access uses it, and it is not in use (a gradient: its D2H copy is enqueued).
    STRATA_RETURN_IF_ERROR(ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) {
      return model_pos_ > dbufs_[f].last_access && dbufs_[f].res.state == S::kReady;
    }));
    last = dbufs_[f].last;
    ptr = dbufs_[f].ptr;
  }
  if (last) STRATA_RETURN_IF_ERROR(last->Synchronize());
  STRATA_RETURN_IF_ERROR(ctx_.dev->Free(ptr));
  MutexLock lock(&ctx_.mu);
  dbufs_[f].ptr = nullptr;
  dev_used_ -= ctx_.dplan.buffers[f].bytes;
  return dbufs_[f].res.To(S::kAbsent).Annotate("freeing device buffer " + std::to_string(f));
}

Status DeviceTier::AllocateBuffer(int id) {
  auto p = ctx_.dev->Allocate(ctx_.dplan.buffers[id].bytes);
  if (!p.ok()) return Status(p.status()).Annotate("device memory for buffer " + std::to_string(id));
  MutexLock lock(&ctx_.mu);
  dbufs_[id].ptr = *p;
  dev_used_ += ctx_.dplan.buffers[id].bytes;
  dev_peak_ = std::max(dev_peak_, dev_used_);
  return Status::OK();
}

Status DeviceTier::RunFeederAccess(int a) {
  const DevStep& ds = ctx_.dplan.steps[a];
  for (int f : ds.frees) STRATA_RETURN_IF_ERROR(FreeBuffer(f));
  if (ds.load) {
    const int id = ds.param_buffer;
    STRATA_RETURN_IF_ERROR(AllocateBuffer(id));
    void* dst;
    {
      MutexLock lock(&ctx_.mu);
      STRATA_RETURN_IF_ERROR(dbufs_[id].res.To(S::kLoading).Annotate("device params"));
      dst = dbufs_[id].ptr;
    }
    STRATA_ASSIGN_OR_RETURN(EventPtr ready, collectives_->FillParams(a, dst));
    MutexLock lock(&ctx_.mu);
    // No event: the collectives set it when they issue the gather into the buffer.
    if (ready) dbufs_[id].ready = std::move(ready);
    STRATA_RETURN_IF_ERROR(dbufs_[id].res.To(S::kReady).Annotate("device params"));
  }
  if (ds.grad_buffer >= 0) {
    STRATA_RETURN_IF_ERROR(AllocateBuffer(ds.grad_buffer));
    MutexLock lock(&ctx_.mu);
    // Allocated for a use that writes it.
    STRATA_RETURN_IF_ERROR(dbufs_[ds.grad_buffer].res.To(S::kReady).Annotate("device gradient"));
  }
  MutexLock lock(&ctx_.mu);
  feeder_pos_ = a + 1;
  ctx_.NotifyLocked();
  return Status::OK();
}

Result<EventPtr> DeviceTier::CopyShardToDevice(int a, void* dst) {
  const UseObj uo = ctx_.hplan.uses[ctx_.hplan.h2d_use[a]].objs[0];
  const int b = ctx_.schedule[a].block;
  void* src;
  {
    MutexLock lock(&ctx_.mu);
    STRATA_RETURN_IF_ERROR(
        ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return host_.ReadableLocked(uo.obj, uo.seq); }));
    STRATA_RETURN_IF_ERROR(host_.EnterLocked(uo.obj));
    src = host_.Obj(uo.obj).buf;
  }
  // This rank's shard into its slot of the block (one rank: the whole block).
  const uint64_t n = ctx_.param_bytes[b] / uint64_t(ctx_.ws);
  char* slot = static_cast<char*>(dst) + uint64_t(ctx_.rank) * n;
  STRATA_RETURN_IF_ERROR(ctx_.dev->CopyToDevice(slot, src, n, "h2d " + ctx_.layout[b].name));
  const int obj = uo.obj;
  STRATA_RETURN_IF_ERROR(ctx_.dev->EnqueueHostFunction(
      Lane::kH2D,
      [this, obj] {
        MutexLock lock(&ctx_.mu);
        return host_.LeaveLocked(obj, false);
      },
      "h2d done"));
  return ctx_.dev->Record(Lane::kH2D);
}

// ---------------------------------------------------------------------------------------
// Lander
// ---------------------------------------------------------------------------------------

void DeviceTier::LanderLoop() {
  for (;;) {
    Landing l;
    {
      MutexLock lock(&ctx_.mu);
      while (!ctx_.shutdown && landings_.empty()) ctx_.cv.Wait();
      if (landings_.empty()) return;  // shutdown
      l = std::move(landings_.front());
      landings_.pop_front();
    }
    Status s = RunLanding(l);
    if (!s.ok()) ctx_.SetWorkerError(std::move(s));
  }
}

Status DeviceTier::RunLanding(const Landing& l) {
  const int a = l.access;
  const int block = ctx_.schedule[a].block;
  const int id = ctx_.dplan.steps[a].grad_buffer;
  const UseObj uo = ctx_.hplan.uses[ctx_.hplan.grad_use[a]].objs[0];
  const int obj = uo.obj;
  const bool first = uo.produce;
  void* dst;
  const void* src;
  {
    MutexLock lock(&ctx_.mu);
    STRATA_RETURN_IF_ERROR(
        ctx_.WaitLocked([&]() REQUIRES(ctx_.mu) { return host_.UsableLocked(obj, uo.seq); }));
    STRATA_RETURN_IF_ERROR(host_.EnterLocked(obj));
    dst = first ? host_.Obj(obj).buf : host_.staging();
    src = dbufs_[id].ptr;
  }
  EventPtr freed_after;
  if (l.ticket != 0) {
    STRATA_RETURN_IF_ERROR(CopySourcesToHost(l, static_cast<float*>(dst)));
  } else {
    STRATA_ASSIGN_OR_RETURN(freed_after, collectives_->LandGrad(a, src, dst, l.computed));
  }
  STRATA_RETURN_IF_ERROR(EnqueueAccumulate(obj, first, block));
  STRATA_ASSIGN_OR_RETURN(EventPtr landed, ctx_.dev->Record(Lane::kD2H));
  MutexLock lock(&ctx_.mu);
  DevBuf& d = dbufs_[id];
  d.last = freed_after ? std::move(freed_after) : std::move(landed);
  STRATA_RETURN_IF_ERROR(
      d.res.Leave(false, false).Annotate("device gradient of " + ctx_.layout[block].name));
  --landings_pending_;
  ctx_.NotifyLocked();
  return Status::OK();
}

Status DeviceTier::CopySourcesToHost(const Landing& l, float* dst) {
  const BlockLayout& bl = ctx_.layout[ctx_.schedule[l.access].block];
  STRATA_RETURN_IF_ERROR(ctx_.dev->WaitEvent(Lane::kD2H, l.computed));
  std::vector<std::pair<float*, uint64_t>> zeros;  // (dst, numel) of the null sources
  for (size_t t = 0; t < bl.tensors.size(); ++t) {
    const TensorLayout& tl = bl.tensors[t];
    if (l.sources[t] == nullptr) {
      zeros.emplace_back(dst + tl.offset, tl.numel);
      continue;
    }
    STRATA_RETURN_IF_ERROR(ctx_.dev->CopyToHost(dst + tl.offset, l.sources[t], tl.numel * 4,
                                                "d2h grad " + bl.name + "." + tl.name));
  }
  return ctx_.dev->EnqueueHostFunction(
      Lane::kD2H,
      [this, zeros = std::move(zeros), sources = l.sources, ticket = l.ticket] {
        for (const auto& [p, n] : zeros) std::memset(p, 0, n * sizeof(float));
        Status first;
        for (const float* p : sources) {
          if (p == nullptr) continue;
          Status s = ctx_.dev->ForgetMemory(p);
          if (first.ok()) first = s;
        }
        tickets_read_.store(ticket, std::memory_order_release);
        return first;
      },
      "grad sources read");
}

Status DeviceTier::EnqueueAccumulate(int obj, bool first, int block) {
  float* acc;
  {
    MutexLock lock(&ctx_.mu);
    acc = static_cast<float*>(host_.Obj(obj).buf);
  }
  const float* landed = static_cast<const float*>(host_.staging());
  const BlockLayout* bl = &ctx_.layout[block];
  return ctx_.dev->EnqueueHostFunction(
      Lane::kD2H,
      [this, obj, first, bl, acc, landed, block] {
        const uint64_t n = bl->shard_numel;
        if (!first) {
          // Micro-batch order is fixed, so this fp32 sum is deterministic.
          for (uint64_t i = 0; i < n; ++i) acc[i] += landed[i];
        }
        // Padding between and after tensors holds whatever the model left: zero it so it
        // adds nothing to the norm and leaves padded params at zero.
        // (Full-block offsets, clipped to this rank's shard.)
        uint64_t pos = 0;
        auto zero = [&](uint64_t begin, uint64_t end) {
          const auto [lo, hi] = ctx_.ShardPart(block, begin, end);
          if (lo < hi) std::memset(acc + lo, 0, (hi - lo) * sizeof(float));
        };
        for (const TensorLayout& t : bl->tensors) {
          if (t.offset > pos) zero(pos, t.offset);
          pos = t.offset + t.numel;
        }
        if (bl->padded_numel > pos) zero(pos, bl->padded_numel);

        MutexLock lock(&ctx_.mu);
        // The final landing: a spilled gradient goes to NVMe now.
        const bool final_landing = optimizer_.GradLandedLocked(block);
        if (final_landing) host_.SetNormPendingLocked(obj, true);
        return host_.LeaveLocked(obj, final_landing);
      },
      "grad landed");
}

}  // namespace strata::engine_internal
