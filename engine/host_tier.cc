#include "engine/host_tier.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "engine/fault_env.h"
#include "engine/rank_commit.h"
#include "strata/log.h"

namespace strata::engine_internal {
namespace {

using S = ResidencyState;

// Plain 4 KiB-aligned memory for between-step utilities (WriteParams, ReadComponent):
// not part of the pinned budget, which covers the steady state of a step.
struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t bytes)
      : data(std::aligned_alloc(4096, RoundUp(std::max<uint64_t>(bytes, 1), 4096))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* data;
};

}  // namespace

// Runs before any thread starts.
Status HostTier::InitPool() NO_THREAD_SAFETY_ANALYSIS {
  const PlacementPlan& place = ctx_.place;
  objs_.resize(size_t(ctx_.L) * kNumComponents);
  for (int o = 0; o < int(objs_.size()); ++o) {
    HostObj& h = objs_[o];
    const Component c = ObjComponent(o);
    h.exists = place.obj_bytes[o] > 0;
    if (!h.exists) continue;
    h.bytes = place.DataBytes(ctx_.layout, o);
    h.cached = place.cached[o];
    // A spilled gradient is written at its final landing (see HostPlanInput::spill_grads).
    h.needs_write =
        c == Component::kGrad ? place.spill_grads : place.home[o] == Tier::kNvme || ctx_.durable;
  }

  // Pinned pool: homes + cache + staging + the activation stash's host slots.
  const uint64_t pool_bytes = place.resident_bytes + place.cache_capacity + place.staging_bytes +
                              place.report.activation_host_bytes;
  PinnedPoolOptions popt;
  popt.budget_bytes = std::max<uint64_t>(pool_bytes, 4096);
  struct rlimit rl {};
  const bool can_lock = getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
                        (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= popt.budget_bytes);
  popt.lock = can_lock;
  // Only a GPU needs the pool locked (its copies run at full speed from page-locked memory);
  // on the host device unlocked memory costs nothing, so the usual 8 MiB limit is no news.
  if (!can_lock && ctx_.dev->Kind() == DeviceKind::kCuda) {
    static std::once_flag once;
    std::call_once(once, [&] {
      LogWarning("pinned host memory of " + FormatBytes(popt.budget_bytes) +
                 " exceeds RLIMIT_MEMLOCK (" + FormatBytes(rl.rlim_cur) +
                 "); using unlocked memory. To lock it, raise the limit: `ulimit -l unlimited` "
                 "in the shell, a memlock line in /etc/security/limits.conf, or "
                 "LimitMEMLOCK=infinity for a systemd service");
    });
  }
  STRATA_ASSIGN_OR_RETURN(pool_, PinnedPool::Create(popt));
  if (ctx_.dev->Kind() == DeviceKind::kCuda) {
    STRATA_RETURN_IF_ERROR(ctx_.dev->RegisterHostMemory(pool_->base(), pool_->size()));
    registered_with_device_ = true;
  }
  if (place.staging_bytes > place.comm_staging_bytes) {
    STRATA_ASSIGN_OR_RETURN(
        staging_, pool_->Allocate(place.staging_bytes - place.comm_staging_bytes, "grad staging"));
  }
  return Status::OK();
}

// Runs before any thread starts.
Status HostTier::InitObjects() NO_THREAD_SAFETY_ANALYSIS {
  const PlacementPlan& place = ctx_.place;
  if (place.cache_capacity) {
    STRATA_ASSIGN_OR_RETURN(void* cache, pool_->Allocate(place.cache_capacity, "cache"));
    cache_base_ = static_cast<char*>(cache);
  }
  host_fixed_ = place.staging_bytes + place.resident_bytes;

  for (int o = 0; o < int(objs_.size()); ++o) {
    HostObj& h = objs_[o];
    if (!h.exists || h.cached) continue;
    STRATA_ASSIGN_OR_RETURN(h.buf, pool_->Allocate(h.bytes, ctx_.Key(o)));
    std::memset(h.buf, 0, h.bytes);
    STRATA_RETURN_IF_ERROR(h.res.To(S::kReady).Annotate(ctx_.ObjName(o)));
  }
  if (!place.use_nvme) return Status::OK();
  if (ctx_.opt.nvme_paths.empty()) {
    return Status::InvalidArgument("the placement needs NVMe but no NVMe paths were given");
  }
  if (ctx_.opt.resume && ctx_.opt.reshard_from.world_size > 0) return ResumeResharded();
  STRATA_RETURN_IF_ERROR(OpenStore());
  const auto committed = store_->CommittedStep();
  if (ctx_.opt.resume) {
    if (!committed) {
      return Status::NotFound("resume: the store in " + ctx_.opt.nvme_paths[0] +
                              " has no committed step: the run stopped before its first "
                              "commit, so there is nothing to resume; start it afresh (the "
                              "same command without --resume works in this folder)");
    }
    ctx_.resumed_step = int64_t(*committed);
    return ResumeFromStore();
  }
  if (committed) {
    // The same refusal the store gives a fresh run over any folder of a committed store
    // (io/stripe_marker.h): whose it is, and how far it got.
    const std::string& folder = ctx_.opt.nvme_paths[0];
    const std::string& run = store_->RunId();
    return Status::InvalidArgument(
               "NVMe folder " + folder + " holds the swap store of another run (" +
               (run.empty() ? std::string("a run without identity") : "run '" + run + "'") +
               "), committed at step " + std::to_string(*committed) +
               ": a fresh run there would destroy it. Resume that run (--resume " + folder +
               "; Engine(resume=True) in Python), or give an empty folder")
        .WithPath(folder);
  }
  return Status::OK();
}

Status HostTier::OpenStore() NO_THREAD_SAFETY_ANALYSIS {
  const EngineOptions& opt = ctx_.opt;
  SwapStoreOptions sopt;
  sopt.paths = opt.nvme_paths;
  sopt.capacity_bytes = ctx_.place.swap_capacity_bytes;  // see SwapCapacity
  sopt.stripe_bytes = opt.nvme_stripe_bytes;
  sopt.create = !opt.resume;
  // A run that stopped after its initial commit (step 0) trained nothing: a fresh run may
  // take its store.
  if (!opt.resume) sopt.replace_through_step = 0;
  sopt.run_id = opt.run_id;
  sopt.previous_run_id = opt.previous_run_id;
  sopt.backend = opt.io;
  const EngineOptions::ReshardSource& reshard = opt.reshard_from;
  const bool resharding = opt.resume && reshard.world_size > 0;
  std::unique_ptr<IoBackend> backend;
  STRATA_ASSIGN_OR_RETURN(const IoBackendFactory factory,
                          FaultsFromEnvironment(opt.io_backend_factory));
  if (factory) {  // else the store makes CreateIoBackend(opt.io)
    STRATA_ASSIGN_OR_RETURN(backend, factory(opt.io));
    if (!backend) {
      return Status::InvalidArgument("EngineOptions::io_backend_factory returned no backend");
    }
  }
  if (resharding) {
    // The new shards are written beside the old committed extents, which stay until the
    // first commit. A rank the old run did not have makes its store (over a stale one of
    // an earlier rank count of the run: never past the step resumed).
    sopt.capacity_bytes += reshard_extra_capacity_;
    sopt.create = ctx_.rank >= reshard.world_size;
    sopt.replace_through_step = std::numeric_limits<uint64_t>::max();
    if (!sopt.create) sopt.previous_run_id = reshard.run_ids[size_t(ctx_.rank)];
    // A prepared commit left here is one of an earlier try of this re-sharding, cut short
    // before any rank finished it (else the new layout would be the store's): dropped.
    sopt.resolve_prepared = [](std::optional<uint64_t>, std::optional<uint64_t>) {
      return Result<bool>(false);
    };
  } else if (opt.resume) {
    sopt.max_capacity_bytes = sopt.capacity_bytes;  // a manifest may not ask for more
    sopt.capacity_bytes = 0;                        // keep the stored size
  }
  // With ranks the stores commit together (rank_commit.h): the ranks agree on the step to
  // resume, rolling a prepared commit forward where a peer finished it.
  const bool agree = opt.resume && ctx_.ws > 1 && !resharding;
  bool agreed = false;
  if (agree) {
    sopt.resolve_prepared = [this, &agreed](std::optional<uint64_t> committed,
                                            std::optional<uint64_t> prepared) {
      agreed = true;
      return AgreeOnResumedCommit(ctx_, committed, prepared);
    };
  }
  sopt.test_hook = KillHookFromEnvironment();
  auto store = SwapStore::Open(sopt, std::move(backend));
  if (!store.ok() && agree && !agreed) ReportFailedResume(ctx_);
  if (!store.ok()) {
    Status s = store.status();
    if (opt.resume && s.code() == StatusCode::kNotFound) {
      s.Annotate("resume: no committed engine state in " + opt.nvme_paths[0]);
    }
    return s;
  }
  store_ = std::move(store).value();
  const BufferRegion region{pool_->base(), pool_->size()};
  return store_->RegisterBuffers(std::span<const BufferRegion>(&region, 1));
}

Status HostTier::ResumeFromStore() NO_THREAD_SAFETY_ANALYSIS {
  int converted = 0;
  std::string converted_from;
  for (int b = 0; b < ctx_.L; ++b) {  // first: a master of the other format is named as such
    const int o = ObjIndex(b, Component::kMaster);
    auto info = store_->Lookup(ctx_.Key(o));
    if (info && info->length != objs_[o].bytes) {
      STRATA_RETURN_IF_ERROR(CheckStoredMaster(o, info->length));
    }
  }
  for (int o = 0; o < int(objs_.size()); ++o) {
    HostObj& h = objs_[o];
    const Component c = ObjComponent(o);
    if (!h.needs_write || c == Component::kGrad) continue;  // a gradient lives one step
    auto info = store_->Lookup(ctx_.Key(o));
    if (!info && ctx_.resumed_step == 0 && (c == Component::kExpAvg || c == Component::kExpAvgSq)) {
      continue;  // the initial commit: moments never updated are zeros, never written
    }
    if (info && info->length != h.bytes && ctx_.opt.convert_state_format &&
        (c == Component::kExpAvg || c == Component::kExpAvgSq)) {
      STRATA_ASSIGN_OR_RETURN(const StateFormat from, ConvertMoment(o, info->length));
      converted_from = StateFormatName(from);
      ++converted;
      continue;
    }
    if (info && info->length != h.bytes && (c == Component::kExpAvg || c == Component::kExpAvgSq)) {
      if (auto stored = StoredMomentLayout(o, info->length)) {
        const std::string have = StateFormatName(stored->formats.moments);
        return Status::InvalidArgument(
            "resume: the committed Adam moments in " + ctx_.opt.nvme_paths[0] + " are " + have +
            ", this engine's state format is " + StateFormatName(ctx_.opt.state_format) +
            ": resume with state format " + have +
            ", or convert them (--allow-state-dtype-change, "
            "EngineOptions::convert_state_format)");
      }
    }
    if (!info || info->length != h.bytes) {
      return Status::Corruption("resume: the committed state in " + ctx_.opt.nvme_paths[0] +
                                " has no " + ctx_.ObjName(o) + " of " + std::to_string(h.bytes) +
                                " bytes (key " + ctx_.Key(o) +
                                "); was it written by a different "
                                "model or placement?");
    }
    h.on_nvme = true;
    if (!h.cached) STRATA_RETURN_IF_ERROR(store_->Read(ctx_.Key(o), h.buf, h.bytes).status());
  }
  if (converted > 0) {
    LogWarning("resume: " + std::to_string(converted) + " Adam moment extents converted from " +
               converted_from + " to " + StateFormatName(ctx_.opt.state_format) +
               " (EngineOptions::convert_state_format); committed with the next step");
  }
  return Status::OK();
}

Status HostTier::CheckStoredMaster(int o, uint64_t stored_bytes) const {
  const BlockLayout& bl = ctx_.layout[ObjBlock(o)];
  for (MasterFormat f : {MasterFormat::kFp32, MasterFormat::kBf16Stochastic}) {
    const BlockStateLayout l =
        DescribeBlockState(bl, ctx_.rank, ctx_.ws, StateFormats{ctx_.opt.state_format, f});
    if (f != ctx_.opt.master_format && l.master.bytes == stored_bytes) {
      return Status::InvalidArgument(
          std::string("resume: the committed master weights in ") + ctx_.opt.nvme_paths[0] +
          " are " + MasterFormatName(f) + " (" + ctx_.ObjName(o) + " is " +
          std::to_string(stored_bytes) + " bytes), this engine's master_format is " +
          MasterFormatName(ctx_.opt.master_format) +
          "; resume with the format the run was written in (--master-dtype)");
    }
  }
  return Status::OK();
}

Result<StateFormat> HostTier::ConvertMoment(int o,
                                            uint64_t stored_bytes) NO_THREAD_SAFETY_ANALYSIS {
  HostObj& h = objs_[o];
  const Component c = ObjComponent(o);
  const BlockLayout& bl = ctx_.layout[ObjBlock(o)];
  const std::optional<BlockStateLayout> from = StoredMomentLayout(o, stored_bytes);
  if (!from) {
    return Status::Corruption("resume: " + ctx_.ObjName(o) + " (key " + ctx_.Key(o) + ") is " +
                              std::to_string(stored_bytes) +
                              " bytes, the length of no state format of this model");
  }
  AlignedBuffer old(RoundUp(stored_bytes, 4096));
  STRATA_RETURN_IF_ERROR(store_->Read(ctx_.Key(o), old.data, stored_bytes).status());
  std::vector<float> values(bl.shard_numel);
  STRATA_RETURN_IF_ERROR(DecodeMoment(
      *from, c, std::span(static_cast<const uint8_t*>(old.data), stored_bytes), values));
  AlignedBuffer tmp(h.cached ? h.bytes : 0);
  void* data = h.cached ? tmp.data : h.buf;
  STRATA_RETURN_IF_ERROR(EncodeMoment(ctx_.place.state[ObjBlock(o)], c, values,
                                      std::span(static_cast<uint8_t*>(data), h.bytes)));
  h.on_nvme = true;
  STRATA_RETURN_IF_ERROR(store_->Write(ctx_.Key(o), data, h.bytes));  // with the next commit
  return from->formats.moments;
}

std::optional<BlockStateLayout> HostTier::StoredMomentLayout(int o, uint64_t stored_bytes) const {
  // The committed format is the one whose extent has the stored length (unambiguous: a
  // tensor takes at least tensor_alignment values, so int8's scales stay below n / 4 bytes).
  const BlockLayout& bl = ctx_.layout[ObjBlock(o)];
  for (StateFormat f : {StateFormat::kFp32, StateFormat::kBf16, StateFormat::kInt8}) {
    BlockStateLayout l =
        DescribeBlockState(bl, ctx_.rank, ctx_.ws, StateFormats{f, ctx_.opt.master_format});
    if (l.Extent(ObjComponent(o))->bytes == stored_bytes) return l;
  }
  return std::nullopt;
}

void HostTier::UnregisterFromDevice() {
  if (registered_with_device_) (void)ctx_.dev->UnregisterHostMemory(pool_->base());
  registered_with_device_ = false;
}

void HostTier::PlanStartLocked(std::vector<int>* resident, std::vector<uint64_t>* offsets) const {
  offsets->assign(objs_.size(), 0);
  for (int o = 0; o < int(objs_.size()); ++o) {
    if (objs_[o].cached && objs_[o].res.state != S::kAbsent) resident->push_back(o);
    (*offsets)[o] = objs_[o].offset;
  }
}

void HostTier::BeginStepLocked() {
  host_cursor_ = 0;
  total_uses_ = 0;
  for (const HostUse& u : ctx_.hplan.uses) {
    for (const UseObj& uo : u.objs) total_uses_ += objs_[uo.obj].exists ? 1 : 0;
  }
  uses_completed_ = 0;
  home_writes_held_ = !ctx_.carried.empty();
  for (HostObj& h : objs_) h.uses_done = 0;
  pool_->ResetPeak();
  cache_peak_ = cache_used_;
}

Status HostTier::EnterLocked(int obj) { return objs_[obj].res.Enter().Annotate(ctx_.ObjName(obj)); }

Status HostTier::LeaveLocked(int obj, bool modified) {
  HostObj& o = objs_[obj];
  STRATA_RETURN_IF_ERROR(o.res.Leave(modified, o.needs_write).Annotate(ctx_.ObjName(obj)));
  if (o.res.state == S::kDirty) (o.cached ? write_queue_ : home_write_queue_).push_back(obj);
  o.uses_done++;
  uses_completed_++;
  ctx_.NotifyLocked();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// I/O thread
// ---------------------------------------------------------------------------------------

// Places a load or an allocation at its offset in the cache; false (error stored) when the
// plan places it over a live copy.
bool HostTier::PlaceLocked(const HostOp& op) {
  HostObj& h = objs_[op.obj];
  h.offset = op.offset;
  h.buf = cache_base_ + h.offset;
  cache_used_ += RoundUp(h.bytes, 4096);
  cache_peak_ = std::max(cache_peak_, cache_used_);
  // The plan never places two live objects on one range; a violation would corrupt data
  // silently, so it is checked (one pass over the objects per placement).
  for (int o = 0; o < int(objs_.size()); ++o) {
    const HostObj& x = objs_[o];
    if (o == op.obj || !x.cached || x.res.state == S::kAbsent) continue;
    if (x.offset < h.offset + RoundUp(h.bytes, 4096) &&
        h.offset < x.offset + RoundUp(x.bytes, 4096)) {
      ctx_.SetErrorLocked(Status::Aborted("internal: host plan places " + ctx_.Key(op.obj) +
                                          " over live " + ctx_.Key(o)));
      return false;
    }
  }
  return true;
}

bool HostTier::TryHostOpLocked(const HostOp& op, std::vector<SwapOp>* reads,
                               std::vector<int>* read_objs) {
  HostObj& h = objs_[op.obj];
  auto transition = [&](S to) REQUIRES(ctx_.mu) {
    Status s = h.res.To(to);
    if (!s.ok()) ctx_.SetErrorLocked(s.Annotate(ctx_.ObjName(op.obj)));
    return s.ok();
  };
  switch (op.kind) {
    case HostOpKind::kEvict: {
      if (h.uses_done < op.uses_before || h.res.state != S::kReady || h.norm_pending) {
        return false;
      }
      cache_used_ -= RoundUp(h.bytes, 4096);
      h.buf = nullptr;
      if (!transition(S::kAbsent)) return false;
      ctx_.NotifyLocked();
      return true;
    }
    case HostOpKind::kLoad:
    case HostOpKind::kAlloc: {
      if (!PlaceLocked(op)) return false;
      if (op.kind == HostOpKind::kAlloc || !h.on_nvme || !store_) {
        // Allocated for a use that writes it, or never written: zeros, as Create promised.
        if (op.kind == HostOpKind::kLoad || ObjComponent(op.obj) == Component::kParam) {
          std::memset(h.buf, 0, h.bytes);
        }
        if (!transition(S::kReady)) return false;
        ctx_.NotifyLocked();
        return true;
      }
      if (!transition(S::kLoading)) return false;
      reads->push_back(SwapOp{IoOp::kRead, ctx_.Key(op.obj), h.buf, h.bytes});
      read_objs->push_back(op.obj);
      return true;
    }
  }
  return false;
}

bool HostTier::StartWriteLocked(std::deque<int>* queue, IoBatch* batch) {
  const int obj = queue->front();
  queue->pop_front();
  HostObj& h = objs_[obj];
  // A reader entered the dirty copy before its write (ReadableLocked): the copy is dirty
  // again when the reader leaves, which queues it again. (So an entry may be stale: a copy
  // is written once per time it became dirty.)
  if (h.res.state != S::kDirty) return true;
  Status s = h.res.To(S::kWriting);
  if (!s.ok()) {
    ctx_.SetErrorLocked(s.Annotate(ctx_.ObjName(obj)));
    return false;
  }
  batch->ops.push_back(SwapOp{IoOp::kWrite, ctx_.Key(obj), h.buf, h.bytes});
  batch->objs.push_back(obj);
  ++writes_in_flight_;
  return true;
}

bool HostTier::GatherIoLocked(IoBatch* batch, int reads_in_flight, int home_writes_in_flight) {
  // Home copies' writes in flight at once, at most: enough to keep the drive busy when
  // nothing else runs, few enough that a read arriving behind them waits little.
  constexpr int kHomeWritesInFlight = 2;
  bool progressed = false;
  while (!write_queue_.empty()) {
    if (!StartWriteLocked(&write_queue_, batch)) return progressed;
    progressed = true;  // readers may share a copy being written (ReadableLocked)
  }
  while (ctx_.step_open && host_cursor_ < ctx_.hplan.ops.size()) {
    if (!TryHostOpLocked(ctx_.hplan.ops[host_cursor_], &batch->ops, &batch->objs)) break;
    ++host_cursor_;
    progressed = true;
  }
  // Loads have someone waiting (a use of the plan); a home copy's write only a commit: it
  // waits for the step's carried updates (ReleaseHomeWritesLocked), so the forward's loads
  // have the drive, and then for a moment without reads.
  const bool reading = home_writes_held_ || reads_in_flight > 0 ||
                       std::any_of(batch->ops.begin(), batch->ops.end(),
                                   [](const SwapOp& op) { return op.op == IoOp::kRead; });
  batch->home_from = batch->ops.size();
  while (!reading && !home_write_queue_.empty() &&
         home_writes_in_flight + int(batch->ops.size() - batch->home_from) < kHomeWritesInFlight) {
    if (!StartWriteLocked(&home_write_queue_, batch)) break;
    progressed = true;
  }
  return progressed;
}

void HostTier::IoLoop() {
  struct InFlight {
    int obj;
    bool write;
    bool home;  // a write of a home copy (home_write_queue_)
    Clock::time_point start;
  };
  std::unordered_map<SwapTicket, InFlight> in_flight;
  int reads_in_flight = 0, home_writes_in_flight = 0;
  std::vector<SwapCompletion> done(64);
  for (;;) {
    IoBatch batch;
    std::vector<SwapOp>& ops = batch.ops;
    {
      MutexLock lock(&ctx_.mu);
      for (;;) {
        if (ctx_.shutdown && in_flight.empty()) return;
        const bool progressed = ctx_.error.ok() && !ctx_.shutdown &&
                                GatherIoLocked(&batch, reads_in_flight, home_writes_in_flight);
        if (progressed) ctx_.NotifyLocked();
        if (!ops.empty() || !in_flight.empty()) break;
        if (progressed) continue;
        ctx_.cv.Wait();
      }
    }
    if (!ops.empty()) {
      const Clock::time_point now = Clock::now();
      auto tickets = store_ ? store_->Submit(ops)
                            : Result<std::vector<SwapTicket>>(
                                  Status::Aborted("internal: NVMe operation without a store"));
      if (!tickets.ok()) {
        ctx_.SetError(Status(tickets.status()).Annotate("submitting NVMe I/O"));
        continue;
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        const bool write = ops[i].op == IoOp::kWrite, home = i >= batch.home_from;
        in_flight[(*tickets)[i]] = InFlight{batch.objs[i], write, home, now};
        reads_in_flight += write ? 0 : 1;
        home_writes_in_flight += home ? 1 : 0;
      }
    }
    if (in_flight.empty()) continue;
    auto n = store_->Poll(std::span<SwapCompletion>(done), 1);
    const Clock::time_point now = Clock::now();
    if (!n.ok()) {
      ctx_.SetError(Status(n.status()).Annotate("waiting for NVMe I/O"));
      // The backend failed: nothing more will complete.
      in_flight.clear();
      reads_in_flight = home_writes_in_flight = 0;
      continue;
    }
    MutexLock lock(&ctx_.mu);
    for (size_t i = 0; i < *n; ++i) {
      SwapCompletion& c = done[i];
      auto it = in_flight.find(c.ticket);
      if (it == in_flight.end()) continue;
      const InFlight f = it->second;
      in_flight.erase(it);
      HostObj& h = objs_[f.obj];
      ctx_.timeline.Add(f.write ? TraceLane::kNvmeWrite : TraceLane::kNvmeRead,
                        (f.write ? "write " : "read ") + ctx_.Key(f.obj), f.start, now, h.bytes);
      if (f.write) --writes_in_flight_;
      reads_in_flight -= f.write ? 0 : 1;
      home_writes_in_flight -= f.home ? 1 : 0;
      if (!c.status.ok()) {
        ctx_.SetErrorLocked(
            Status(c.status).Annotate(std::string(f.write ? "writing " : "reading ") +
                                      ctx_.ObjName(f.obj) + " (key " + ctx_.Key(f.obj) + ")"));
        continue;
      }
      if (f.write) h.on_nvme = true;
      Status s = f.write ? h.res.WriteDone() : h.res.To(S::kReady);
      if (!s.ok()) ctx_.SetErrorLocked(s.Annotate(ctx_.ObjName(f.obj)));
    }
    ctx_.NotifyLocked();
  }
}

// ---------------------------------------------------------------------------------------
// Between steps
// ---------------------------------------------------------------------------------------

Status HostTier::ReadObjLocked(int obj, void* dst) const {
  const HostObj& h = objs_[obj];
  if (h.buf && h.res.state != S::kAbsent && h.res.state != S::kLoading) {
    std::memcpy(dst, h.buf, h.bytes);
    return Status::OK();
  }
  if (!h.on_nvme || !store_) {
    std::memset(dst, 0, h.bytes);
    return Status::OK();
  }
  AlignedBuffer tmp(h.bytes);
  STRATA_RETURN_IF_ERROR(store_->Read(ctx_.Key(obj), tmp.data, RoundUp(h.bytes, 4096)).status());
  std::memcpy(dst, tmp.data, h.bytes);
  return Status::OK();
}

Status HostTier::WriteComponentLocked(int block, Component component,
                                      std::span<const float> values) {
  const BlockLayout& bl = ctx_.layout[block];
  if (component != Component::kMaster && component != Component::kExpAvg &&
      component != Component::kExpAvgSq) {
    return Status::InvalidArgument(std::string("WriteComponent: ") + ComponentName(component) +
                                   " cannot be written (master, exp_avg or exp_avg_sq)");
  }
  if (values.size() != bl.shard_numel) {
    return Status::InvalidArgument("WriteComponent: block '" + bl.name + "' has " +
                                   std::to_string(bl.shard_numel) + " elements per shard, got " +
                                   std::to_string(values.size()));
  }
  if (component == Component::kMaster) {  // the shard as one tensor: master and param copy
    const uint64_t first = uint64_t(ctx_.rank) * bl.shard_numel;
    const TensorLayout shard{
        .name = bl.name, .shape = {}, .offset = first, .numel = bl.shard_numel};
    return WriteTensorLocked(block, shard, values);
  }
  const int obj = ObjIndex(block, component);
  HostObj& h = objs_[obj];
  const bool resident = h.buf && h.res.state == S::kReady;
  AlignedBuffer tmp(resident ? 0 : h.bytes);
  void* data = resident ? h.buf : tmp.data;
  STRATA_RETURN_IF_ERROR(EncodeMoment(ctx_.place.state[block], component, values,
                                      std::span(static_cast<uint8_t*>(data), h.bytes)));
  if (h.needs_write && store_) {
    STRATA_RETURN_IF_ERROR(store_->Write(ctx_.Key(obj), data, h.bytes));
    h.on_nvme = true;
  } else if (!resident) {
    return Status::Aborted("internal: " + ctx_.ObjName(obj) + " has neither a host copy nor NVMe");
  }
  return Status::OK();
}

Status HostTier::WriteTensorLocked(int block, const TensorLayout& t,
                                   std::span<const float> values) {
  std::vector<int> targets = {ObjIndex(block, Component::kMaster)};
  if (ctx_.separate) targets.push_back(ObjIndex(block, Component::kParam));
  for (int obj : targets) {
    HostObj& h = objs_[obj];
    const bool resident = h.buf && h.res.state == S::kReady;
    AlignedBuffer tmp(resident ? 0 : h.bytes);
    void* data = resident ? h.buf : tmp.data;
    if (!resident) STRATA_RETURN_IF_ERROR(ReadObjLocked(obj, data));
    // This rank's part of the tensor: values[k] is full-block element t.offset + k.
    const auto [lo, hi] = ctx_.ShardPart(block, t.offset, t.offset + t.numel);
    const uint64_t first = lo + uint64_t(ctx_.rank) * ctx_.layout[block].shard_numel - t.offset;
    const bool bf16 = ObjComponent(obj) == Component::kParam ||
                      ctx_.place.state[block].master.elem_bytes == 2;  // a bf16 master
    if (bf16) {
      uint16_t* p = static_cast<uint16_t*>(data) + lo;
      for (uint64_t i = 0; i < hi - lo; ++i) p[i] = FloatToBf16(values[first + i]);
    } else if (hi > lo) {
      std::memcpy(static_cast<float*>(data) + lo, values.data() + first, (hi - lo) * sizeof(float));
    }
    if (h.needs_write && store_) {
      STRATA_RETURN_IF_ERROR(store_->Write(ctx_.Key(obj), data, h.bytes));
      h.on_nvme = true;
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------
// EndStep: redo or undo of speculative updates
// ---------------------------------------------------------------------------------------

Status HostTier::RollBackLocked(const std::vector<int>& blocks, StatesFrom from,
                                const std::vector<int>& keep,
                                const std::function<Status(int, const BlockBuffers&)>& redo) {
  if (blocks.empty()) return Status::OK();
  if (!store_ && from == StatesFrom::kCommitted) {
    return Status::Aborted("internal: a speculative update without an NVMe store");
  }
  std::vector<bool> held(objs_.size(), false);
  for (int o : keep) held[o] = objs_[o].res.state != S::kAbsent;
  // Every cached copy but the held gradients leaves: the step's writes have landed, so NVMe
  // has them, and the blocks' copies are staged afresh below.
  RangeAllocator free_ranges(ctx_.place.cache_capacity);
  for (int o = 0; o < int(objs_.size()); ++o) {
    HostObj& h = objs_[o];
    if (!h.cached || h.res.state == S::kAbsent) continue;
    if (held[o]) {
      (void)free_ranges.Claim(h.offset, RoundUp(h.bytes, 4096));
      continue;
    }
    STRATA_RETURN_IF_ERROR(h.res.To(S::kAbsent).Annotate(ctx_.ObjName(o)));
    cache_used_ -= RoundUp(h.bytes, 4096);
    h.buf = nullptr;
  }
  for (int b : blocks) {
    BlockBuffers bufs{};
    std::vector<std::pair<uint64_t, uint64_t>> staged;  // cache ranges
    std::vector<std::unique_ptr<AlignedBuffer>> spare;  // when the cache is fragmented
    for (int c = 0; c < kNumComponents; ++c) {
      const int o = ObjIndex(b, Component(c));
      HostObj& h = objs_[o];
      if (!h.exists) continue;
      if (!h.cached || held[o]) {  // a home copy, or a held gradient: in place
        bufs[c] = h.buf;
        continue;
      }
      const uint64_t size = RoundUp(h.bytes, 4096);
      const std::optional<uint64_t> off = cache_base_ ? free_ranges.Allocate(size) : std::nullopt;
      if (off) {
        bufs[c] = cache_base_ + *off;
        staged.emplace_back(*off, size);
      } else {
        spare.push_back(std::make_unique<AlignedBuffer>(h.bytes));
        bufs[c] = spare.back()->data;
      }
    }
    if (!ctx_.separate) bufs[int(Component::kParam)] = nullptr;
    Status s = RestoreBlockLocked(b, from, bufs, redo);
    for (auto [off, size] : staged) free_ranges.Free(off, size);
    STRATA_RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

Status HostTier::RestoreBlockLocked(int b, StatesFrom from, const BlockBuffers& bufs,
                                    const std::function<Status(int, const BlockBuffers&)>& redo) {
  const Component states[] = {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq,
                              Component::kParam};
  for (Component c : states) {
    const int o = ObjIndex(b, c);
    if (!bufs[int(c)]) continue;
    const HostObj& h = objs_[o];
    if (from == StatesFrom::kCurrent) {
      // A host copy in place is current; a staged one comes from NVMe (zeros if never written).
      if (bufs[int(c)] == h.buf) continue;
      if (!h.on_nvme || !store_) {
        std::memset(bufs[int(c)], 0, h.bytes);
        continue;
      }
      auto got = store_->Read(ctx_.Key(o), bufs[int(c)], RoundUp(h.bytes, 4096));
      if (!got.ok()) return Status(got.status()).Annotate("reading " + ctx_.ObjName(o));
      continue;
    }
    auto got = store_->ReadCommitted(ctx_.Key(o), bufs[int(c)], RoundUp(h.bytes, 4096));
    if (got.ok()) continue;
    if (got.status().code() != StatusCode::kNotFound) {
      return Status(got.status()).Annotate("restoring the previous " + ctx_.ObjName(o));
    }
    std::memset(bufs[int(c)], 0, h.bytes);  // never committed: zeros, as at the start
  }
  if (!redo) {  // a skipped step: the committed versions stand
    for (Component c : states) {
      const int o = ObjIndex(b, c);
      if (!bufs[int(c)]) continue;
      store_->Revert(ctx_.Key(o));
      objs_[o].on_nvme = store_->Lookup(ctx_.Key(o)).has_value();
    }
    return Status::OK();
  }
  const int g = ObjIndex(b, Component::kGrad);
  if (bufs[int(Component::kGrad)] != objs_[g].buf && store_) {  // spilled: this step's
    auto got =
        store_->Read(ctx_.Key(g), bufs[int(Component::kGrad)], RoundUp(objs_[g].bytes, 4096));
    if (!got.ok()) {
      return Status(got.status())
          .Annotate("reloading the gradient of block '" + ctx_.layout[b].name + "' for its redo");
    }
  }
  STRATA_RETURN_IF_ERROR(redo(b, bufs));
  for (Component c : states) {
    const int o = ObjIndex(b, c);
    if (!bufs[int(c)] || !objs_[o].needs_write || !store_) continue;
    // The speculative version goes first: the swap file has room for one pending version of
    // each extent beside the committed one, not two.
    if (from == StatesFrom::kCommitted) store_->Revert(ctx_.Key(o));
    STRATA_RETURN_IF_ERROR(store_->Write(ctx_.Key(o), bufs[int(c)], objs_[o].bytes)
                               .Annotate("writing the redone " + ctx_.ObjName(o)));
    objs_[o].on_nvme = true;
  }
  return Status::OK();
}

bool HostTier::WritesLandedLocked(const std::vector<int>& blocks) const {
  for (int b : blocks) {
    for (int c = 0; c < kNumComponents; ++c) {
      const HostObj& h = objs_[ObjIndex(b, Component(c))];
      if (h.res.state == S::kDirty || h.res.state == S::kWriting || h.res.dirty_pending) {
        return false;
      }
    }
  }
  return true;
}

uint64_t HostTier::UpdateWriteBytesLocked(const std::vector<int>& blocks) const {
  if (!store_) return 0;
  uint64_t bytes = 0;
  for (int b : blocks) {
    for (Component c :
         {Component::kMaster, Component::kExpAvg, Component::kExpAvgSq, Component::kParam}) {
      const HostObj& h = objs_[ObjIndex(b, c)];
      if (h.exists && h.needs_write) bytes += h.bytes;
    }
  }
  return bytes;
}

Status HostTier::ReleaseLocked(const std::vector<int>& objs) {
  for (int o : objs) {
    HostObj& h = objs_[o];
    if (h.res.state == S::kAbsent) continue;
    STRATA_RETURN_IF_ERROR(h.res.To(S::kAbsent).Annotate(ctx_.ObjName(o)));
    cache_used_ -= RoundUp(h.bytes, 4096);
    h.buf = nullptr;
  }
  return Status::OK();
}

Status HostTier::CommitLocked(uint64_t step) {
  if (!store_) return Status::OK();
  ctx_.mu.Unlock();
  Status s = ctx_.ws > 1 ? CommitWithRanks(ctx_, *store_, step) : store_->Commit(step);
  ctx_.mu.Lock();
  return s;
}

}  // namespace strata::engine_internal
