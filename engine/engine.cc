// The engine's executors: they run the plans of engine/plan.h against the real tiers.
//
// Threads (docs/design.md "One step, and who owns what"):
//  - the model's thread calls the step API (Acquire/Release/GradBuffer/SubmitGrads);
//  - the I/O thread owns the SwapStore (one IoBackend ring, one submitting thread): it runs
//    the host plan's operations in order (evict, load = NVMe read, allocate) and submits
//    the NVMe writes of updated components as soon as the optimizer hands them over;
//  - the device feeder runs the device plan in order: frees evicted buffers once the work
//    that used them finished, allocates, enqueues H2D copies;
//  - the lander enqueues each submitted gradient's D2H copy (and the fp32 accumulation
//    after it, on the D2H lane) once its host accumulator is placed, so SubmitGrads never
//    blocks the model on host memory;
//  - the optimizer worker runs the blocks' AdamW steps in plan order (OpenMP inside the
//    kernel), each as soon as its gradient is final and its states are loaded; it computes
//    each block's squared gradient norm first (combined in block order for clipping);
//  - with a communicator, the comm thread issues every collective of the step, in an order
//    fixed at BeginStep from the schedule and the plans (the same on every rank, since
//    collectives match by order): the all-gather of each loaded block's parameters, one
//    load ahead of the reduce-scatter of each backward gradient, and last the all-gather of
//    the ranks' squared gradient norms (on the host communicator), summed in rank order so
//    every rank gets the same norm. Where they run (EngineOptions::collective_memory):
//      device memory: the feeder copies this rank's shard into its slot of the block's
//        device buffer; the all-gather fills the other slots in place on Lane::kComm,
//        ordered after that copy by CollectiveOptions::after, and compute waits for it by
//        an event. The reduce-scatter averages the gradient in place in its device buffer
//        (after the compute that wrote it); the lander copies this rank's shard back after
//        it. A host communicator (Gloo on a HostDevice) completes on its own thread, so a
//        host function on Lane::kComm waits for it; NCCL runs on that lane's stream.
//      host memory: the all-gather fills a full-block pinned gather buffer as soon as the
//        shard is in host memory, and the H2D lane copies the whole block after it; the
//        D2H copy lands the whole gradient in a pinned buffer, the reduce-scatter (after
//        that copy) averages it into this rank's shard, and the accumulation waits for it.
//  - the watcher waits for every collective the comm thread issued, in order, and stores
//    the first failure (a lost rank, a timeout). Waiting is what enforces the timeout on
//    NCCL, whose handles abort the communicator when it passes: a dead peer then ends the
//    step with an error instead of leaving device work waiting forever.
// All of them block on one condition variable (or on an I/O completion, or a device
// event); nothing spins. State shared between them is guarded by mu_.
//
// Each step's plan is fixed at BeginStep, so every thread knows what comes next; the
// model's calls are checked against the plan's access schedule.
#include "strata/engine.h"

#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "engine/plan.h"
#include "engine/residency.h"
#include "engine/trace.h"
#include "io/pinned_pool.h"
#include "io/swap_store.h"
#include "strata/comm.h"
#include "strata/log.h"
#include "strata/optim.h"

namespace strata {
namespace engine_internal {
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

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, std::vector<BlockLayout> layout)
      : opt_(options),
        dev_(options.device),
        comm_(options.comm),
        host_comm_(options.host_comm ? options.host_comm : options.comm),
        collective_(options.comm != nullptr),
        device_collectives_(options.comm != nullptr &&
                            options.collective_memory == CollectiveMemory::kDevice),
        ws_(options.comm ? options.comm->world_size() : 1),
        rank_(options.comm ? options.comm->rank() : 0),
        layout_(std::move(layout)),
        L_(int(layout_.size())) {}
  ~EngineImpl() override;

  Status Init();

  const std::vector<BlockLayout>& Layout() const override { return layout_; }
  const PlacementReport& Placement() const override { return place_.report; }
  int64_t ResumedStep() const override { return resumed_step_; }
  Status WriteParams(int block, int tensor, std::span<const float> values) override;
  Status CommitParams() override;
  Status ReadParams(int block, int tensor, std::span<float> out) const override;
  Status ReadComponent(int block, Component component, std::span<float> out) const override;
  Status BeginStep(const StepArgs& args) override;
  Result<BlockView> Acquire(int block, Pass pass) override;
  Status Release(int block) override;
  Result<float*> GradBuffer(int block) override;
  Status SubmitGrads(int block) override;
  Result<StepStats> EndStep() override;
  Status Error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  struct HostObj {
    Residency res;
    void* buf = nullptr;
    uint64_t bytes = 0;        // logical bytes (shard elements x element size)
    bool exists = false;       // the component exists (kParam only with a separate dtype)
    bool cached = false;       // lives in the cache (NVMe home, or a gradient)
    bool needs_write = false;  // updates go to NVMe (NVMe home, or durable)
    bool on_nvme = false;      // the store holds a version (else the content is zeros)
    int uses_done = 0;         // uses of this step completed
    uint64_t offset = 0;       // place in the cache region (cached objects)
  };
  struct DevBuf {
    void* ptr = nullptr;
    Residency res;
    EventPtr ready;  // H2D copy done
    EventPtr last;   // the last work that used it (compute after Release; D2H for grads)
    bool landing_enqueued = false;  // grads: the D2H copy out of it is enqueued
    int last_access = -1;           // the last access of the plan that uses it
  };

  std::string Key(int obj) const {
    return "b" + std::to_string(ObjBlock(obj)) + "." + ComponentName(ObjComponent(obj));
  }
  std::string ObjName(int obj) const {
    return "block '" + layout_[ObjBlock(obj)].name + "' " + ComponentName(ObjComponent(obj));
  }
  void SetErrorLocked(Status s) {
    if (error_.ok() && !s.ok()) error_ = std::move(s);
    cv_.notify_all();
  }
  void SetError(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    SetErrorLocked(std::move(s));
  }
  // Waits on cv_ until pred() or an error; returns the error.
  template <typename Pred>
  Status WaitLocked(std::unique_lock<std::mutex>& lk, Pred pred) {
    cv_.wait(lk, [&] { return !error_.ok() || shutdown_ || pred(); });
    if (!error_.ok()) return error_;
    if (shutdown_) return Status::Aborted("engine is shutting down");
    return Status::OK();
  }
  void UseDoneLocked(int obj) {
    objs_[obj].uses_done++;
    uses_completed_++;
    cv_.notify_all();
  }
  Status LeaveLocked(int obj, bool modified) {
    HostObj& o = objs_[obj];
    if (!o.res.Leave(modified, o.needs_write)) {
      return Status::Aborted("internal: bad residency transition leaving " + ObjName(obj) +
                             " in state " + ResidencyStateName(o.res.state));
    }
    if (o.res.state == S::kDirty) write_queue_.push_back(obj);
    UseDoneLocked(obj);
    return Status::OK();
  }

  void IoLoop();
  void RunStepWorker(const std::function<size_t()>& count,
                     const std::function<Status(size_t)>& item);
  void FeederLoop();
  void LanderLoop();
  struct Landing {
    int access = 0;
    EventPtr computed;  // the compute that wrote the gradient
  };
  Status RunLanding(const Landing& l);
  void OptimizerLoop();
  // Runs host op `op` if its dependencies are met; false when it must wait.
  bool TryHostOpLocked(const HostOp& op, std::vector<SwapOp>* reads, std::vector<int>* read_objs);
  Status RunOptimizer(int use_index);
  Status RunFeederAccess(int a);
  // Multi-rank: the comm thread and its items.
  void CommLoop();
  Status RunCommItem(size_t i);
  void OnCommOp(const CommOpRecord& r);
  // An event on Lane::kComm that completes with collective `h` (device memory mode).
  Result<EventPtr> CollectiveDoneEvent(const CommHandle& h, const std::string& label);
  // Hands an issued collective to the watcher. REQUIRES: mu_ held.
  void WatchLocked(const CommHandle& h) {
    watch_.push_back(h);
    cv_.notify_all();
  }
  void WatchLoop();
  // At Create: every rank must pass the same options (they fix the order of collectives).
  Status CheckOptionsAgreeAcrossRanks();
  // Fixes the step's order of collectives from its host plan (at BeginStep).
  void BuildCommSequence();
  // The part of [begin, end) (full-block elements) inside this rank's shard, as shard-local
  // [lo, hi); lo == hi when they do not meet.
  std::pair<uint64_t, uint64_t> ShardPart(int block, uint64_t begin, uint64_t end) const {
    const uint64_t s0 = uint64_t(rank_) * layout_[block].shard_numel;
    const uint64_t s1 = s0 + layout_[block].shard_numel;
    const uint64_t lo = std::max(begin, s0), hi = std::min(end, s1);
    return lo < hi ? std::make_pair(lo - s0, hi - s0) : std::make_pair(uint64_t(0), uint64_t(0));
  }
  Status CommitLocked(std::unique_lock<std::mutex>& lk, uint64_t step);
  void OnDeviceOp(const DeviceOpRecord& r);
  Status CheckBlockTensor(int block, int tensor) const;
  // Reads the whole component into `dst` (fp32 or bf16 bytes) between steps.
  Status ReadObjLocked(int obj, void* dst) const;

  const EngineOptions opt_;
  Device* const dev_;
  Communicator* const comm_;       // nullptr: one rank, no collectives
  Communicator* const host_comm_;  // host-memory collectives (norm, ReadParams); or comm_
  const bool collective_;          // comm_ is set (a 1-rank communicator runs them too)
  const bool device_collectives_;  // gathers and reduce-scatters in device memory
  const int ws_, rank_;
  const std::vector<BlockLayout> layout_;
  const int L_;
  WorkingDtype dtype_ = WorkingDtype::kFp32;
  bool separate_ = false;
  bool durable_ = false;
  uint64_t device_budget_ = 0;
  PlacementPlan place_;
  std::vector<Access> schedule_;
  DevicePlan dplan_;
  std::vector<uint64_t> param_bytes_, grad_bytes_;
  std::unique_ptr<PinnedPool> pool_;
  bool registered_with_device_ = false;
  std::unique_ptr<SwapStore> store_;
  void* staging_ = nullptr;  // gradient landing buffer for micro-batches after the first
  // Collectives in host memory (in the pinned pool): two full-block parameter gather
  // buffers and one full-block gradient landing buffer (the reduce-scatter's input).
  void* gather_[2] = {nullptr, nullptr};
  void* grad_full_ = nullptr;
  // The comm thread's fixed sequence of collectives per step.
  std::vector<CommItem> comm_seq_;
  // The cache: one pinned region; the host plan places objects inside it (exact offsets, so
  // the simulated footprint and fragmentation are the real ones).
  char* cache_base_ = nullptr;
  uint64_t cache_used_ = 0, cache_peak_ = 0, host_fixed_ = 0;
  Timeline timeline_;
  int64_t resumed_step_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status error_;
  bool shutdown_ = false;
  std::vector<HostObj> objs_;
  bool params_dirty_ = false;  // WriteParams since the last commit

  // The open step.
  bool step_open_ = false;
  uint64_t generation_ = 0;  // bumps at each BeginStep; threads pick up the new plan
  int64_t step_ = 0;
  StepArgs args_;
  HostPlan hplan_;
  std::vector<DevBuf> dbufs_;
  uint64_t dev_used_ = 0, dev_peak_ = 0;
  int model_pos_ = 0;  // accesses released by the model
  int acquired_ = -1;  // access currently acquired
  bool grads_submitted_ = false;
  int feeder_pos_ = 0;  // accesses prepared by the feeder
  size_t host_cursor_ = 0;
  size_t opts_done_ = 0;
  int64_t total_uses_ = 0, uses_completed_ = 0;
  std::vector<int> grads_in_;  // gradient landings completed per block
  std::vector<double> norm_sq_;
  std::vector<uint64_t> non_finite_;
  std::vector<bool> norm_known_;
  double grad_norm_ = 0, clip_coef_ = 1;
  bool skip_update_ = false;
  bool norm_final_ = false;
  std::deque<int> write_queue_;
  std::deque<Landing> landings_;  // submitted gradients waiting for their D2H
  int writes_in_flight_ = 0;
  Clock::time_point step_start_;

  CpuKernelOptions kernel_options_;

  // Multi-rank step state (guarded by mu_), indexed by access.
  size_t comm_pos_ = 0;  // items of comm_seq_ issued (or finished, for kNorm)
  bool gather_busy_[2] = {false, false};
  std::vector<bool> ag_issued_;  // the all-gather of the access's params is issued
  std::vector<CommHandle> ag_handle_;
  std::vector<int> ag_slot_;
  std::vector<EventPtr>
      shard_h2d_;  // device memory: H2D copy of this rank's shard (set = enqueued)
  // What the reduce-scatter waits for (set = it may be issued): the compute that wrote the
  // gradient (device memory) or its D2H copy (host memory).
  std::vector<EventPtr> rs_after_;
  std::vector<void*> rs_dst_;  // host memory: where the reduce-scatter writes this rank's shard
  std::vector<bool> rs_issued_;
  std::vector<CommHandle> rs_handle_;
  std::vector<EventPtr> rs_done_;  // device memory: Lane::kComm event after the reduce-scatter
  std::deque<CommHandle> watch_;   // issued collectives the watcher has not waited for

  std::thread io_thread_, feeder_thread_, opt_thread_, lander_thread_, comm_thread_, watch_thread_;
};

Status EngineImpl::Init() {
  if (!dev_) return Status::InvalidArgument("EngineOptions::device is required");
  if (opt_.micro_batches < 1) {
    return Status::InvalidArgument("micro_batches is " + std::to_string(opt_.micro_batches) +
                                   "; it must be >= 1");
  }
  // First, before anything that could fail on one rank only and leave the others waiting in
  // a collective.
  if (collective_ && ws_ > 1) STRATA_RETURN_IF_ERROR(CheckOptionsAgreeAcrossRanks());
  if (opt_.grad_clip < 0 || !std::isfinite(opt_.grad_clip)) {
    return Status::InvalidArgument("grad_clip must be >= 0");
  }
  if (!(opt_.beta1 >= 0 && opt_.beta1 < 1 && opt_.beta2 >= 0 && opt_.beta2 < 1 && opt_.eps >= 0 &&
        opt_.weight_decay >= 0)) {
    return Status::InvalidArgument(
        "optimizer hyper-parameters out of range (beta1 " + std::to_string(opt_.beta1) +
        ", beta2 " + std::to_string(opt_.beta2) + ", eps " + std::to_string(opt_.eps) +
        ", weight_decay " + std::to_string(opt_.weight_decay) + ")");
  }
  dtype_ = opt_.dtype;
  if (dtype_ == WorkingDtype::kAuto) {
    dtype_ = dev_->Kind() == DeviceKind::kCuda ? WorkingDtype::kBf16 : WorkingDtype::kFp32;
  }
  separate_ = dtype_ != WorkingDtype::kFp32;
  durable_ = opt_.durable || opt_.resume;
  kernel_options_.threads = opt_.optimizer_threads;
  device_budget_ = opt_.device_mem_bytes;

  STRATA_ASSIGN_OR_RETURN(place_, PlanPlacement(layout_, PlanOptionsFrom(opt_, dtype_)));
  schedule_ = place_.schedule;
  param_bytes_ = place_.param_bytes;
  grad_bytes_ = place_.grad_bytes;
  dplan_ = place_.device;

  objs_.resize(size_t(L_) * kNumComponents);
  for (int o = 0; o < int(objs_.size()); ++o) {
    HostObj& h = objs_[o];
    const Component c = ObjComponent(o);
    h.exists = place_.obj_bytes[o] > 0;
    if (!h.exists) continue;
    h.bytes = layout_[ObjBlock(o)].shard_numel * (c == Component::kParam ? 2 : 4);
    h.cached = place_.cached[o];
    h.needs_write = c != Component::kGrad && (place_.home[o] == Tier::kNvme || durable_);
  }

  // Pinned pool: homes + cache + staging.
  const uint64_t pool_bytes = place_.resident_bytes + place_.cache_capacity + place_.staging_bytes;
  PinnedPoolOptions popt;
  popt.budget_bytes = std::max<uint64_t>(pool_bytes, 4096);
  struct rlimit rl {};
  const bool can_lock = getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
                        (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= popt.budget_bytes);
  popt.lock = can_lock;
  // Only a GPU needs the pool locked (its copies run at full speed from page-locked memory);
  // on the host device unlocked memory costs nothing, so the usual 8 MiB limit is no news.
  if (!can_lock && dev_->Kind() == DeviceKind::kCuda) {
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
  if (dev_->Kind() == DeviceKind::kCuda) {
    STRATA_RETURN_IF_ERROR(dev_->RegisterHostMemory(pool_->base(), pool_->size()));
    registered_with_device_ = true;
  }
  if (place_.staging_bytes > place_.comm_staging_bytes) {
    STRATA_ASSIGN_OR_RETURN(
        staging_,
        pool_->Allocate(place_.staging_bytes - place_.comm_staging_bytes, "grad staging"));
  }
  if (collective_ && !device_collectives_) {
    for (void*& g : gather_) {
      STRATA_ASSIGN_OR_RETURN(g, pool_->Allocate(place_.gather_bytes, "param gather"));
    }
    STRATA_ASSIGN_OR_RETURN(grad_full_,
                            pool_->Allocate(place_.comm_staging_bytes - 2 * place_.gather_bytes,
                                            "grad landing (reduce-scatter input)"));
  }
  if (place_.cache_capacity) {
    STRATA_ASSIGN_OR_RETURN(void* cache, pool_->Allocate(place_.cache_capacity, "cache"));
    cache_base_ = static_cast<char*>(cache);
  }
  host_fixed_ = place_.staging_bytes + place_.resident_bytes;

  for (int o = 0; o < int(objs_.size()); ++o) {
    HostObj& h = objs_[o];
    if (!h.exists || h.cached) continue;
    STRATA_ASSIGN_OR_RETURN(h.buf, pool_->Allocate(h.bytes, Key(o)));
    std::memset(h.buf, 0, h.bytes);
    if (!h.res.To(S::kReady)) return Status::Aborted("internal: residency");
  }

  if (place_.use_nvme) {
    if (opt_.nvme_paths.empty()) {
      return Status::InvalidArgument("the placement needs NVMe but no NVMe paths were given");
    }
    SwapStoreOptions sopt;
    sopt.paths = opt_.nvme_paths;
    // A committed and a pending version of every component, plus room for fragmentation.
    sopt.capacity_bytes =
        2 * place_.nvme_bytes + 2 * opt_.nvme_stripe_bytes * sopt.paths.size() + (16ull << 20);
    sopt.stripe_bytes = opt_.nvme_stripe_bytes;
    sopt.create = !opt_.resume;
    sopt.backend = opt_.io;
    std::unique_ptr<IoBackend> backend;
    if (opt_.wrap_backend) {
      STRATA_ASSIGN_OR_RETURN(backend, CreateIoBackend(opt_.io));
      STRATA_ASSIGN_OR_RETURN(backend, opt_.wrap_backend(std::move(backend)));
    }
    if (opt_.resume) {
      sopt.max_capacity_bytes = sopt.capacity_bytes;  // a manifest may not ask for more
      sopt.capacity_bytes = 0;                        // keep the stored size
    }
    auto store = SwapStore::Open(sopt, std::move(backend));
    if (!store.ok()) {
      Status s = store.status();
      if (opt_.resume && s.code() == StatusCode::kNotFound) {
        s.Annotate("resume: no committed engine state in " + opt_.nvme_paths[0]);
      }
      return s;
    }
    store_ = std::move(store).value();
    const BufferRegion region{pool_->base(), pool_->size()};
    STRATA_RETURN_IF_ERROR(store_->RegisterBuffers(std::span<const BufferRegion>(&region, 1)));
    const auto committed = store_->CommittedStep();
    if (opt_.resume) {
      if (!committed) {
        return Status::NotFound("resume: the store in " + opt_.nvme_paths[0] +
                                " has no committed step");
      }
      resumed_step_ = int64_t(*committed);
      for (int o = 0; o < int(objs_.size()); ++o) {
        HostObj& h = objs_[o];
        if (!h.needs_write) continue;
        auto info = store_->Lookup(Key(o));
        if (!info || info->length != h.bytes) {
          return Status::Corruption("resume: the committed state in " + opt_.nvme_paths[0] +
                                    " has no " + ObjName(o) + " of " + std::to_string(h.bytes) +
                                    " bytes (key " + Key(o) +
                                    "); was it written by a different "
                                    "model or placement?");
        }
        h.on_nvme = true;
        if (!h.cached) STRATA_RETURN_IF_ERROR(store_->Read(Key(o), h.buf, h.bytes).status());
      }
    } else if (committed) {
      return Status::InvalidArgument(
          "NVMe folder " + opt_.nvme_paths[0] + " already holds a committed engine state (step " +
          std::to_string(*committed) + "); resume from it or use an empty folder");
    }
  }

  if (!opt_.trace_path.empty()) {
    STRATA_RETURN_IF_ERROR(timeline_.OpenTrace(
        opt_.trace_path,
        opt_.trace_process_name.empty() ? "strata engine" : opt_.trace_process_name,
        opt_.trace_pid));
    timeline_.SetTraceRecording(opt_.trace_first_step <= resumed_step_ + 1);
  }
  dev_->SetObserver([this](const DeviceOpRecord& r) { OnDeviceOp(r); });
  if (collective_) {
    comm_->SetObserver([this](const CommOpRecord& r) { OnCommOp(r); });
    if (host_comm_ != comm_)
      host_comm_->SetObserver([this](const CommOpRecord& r) { OnCommOp(r); });
    comm_thread_ = std::thread([this] { CommLoop(); });
    watch_thread_ = std::thread([this] { WatchLoop(); });
  }

  io_thread_ = std::thread([this] { IoLoop(); });
  feeder_thread_ = std::thread([this] { FeederLoop(); });
  opt_thread_ = std::thread([this] { OptimizerLoop(); });
  lander_thread_ = std::thread([this] { LanderLoop(); });
  return Status::OK();
}

EngineImpl::~EngineImpl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    cv_.notify_all();
  }
  if (comm_thread_.joinable()) comm_thread_.join();
  if (opt_thread_.joinable()) opt_thread_.join();
  if (lander_thread_.joinable()) lander_thread_.join();
  if (feeder_thread_.joinable()) feeder_thread_.join();
  if (io_thread_.joinable()) io_thread_.join();
  if (dev_) {
    // Lane work may still reference our buffers and call back into us. Collectives still
    // queued read and write our buffers too: the watcher waits for every one of them (a
    // broken communicator fails them at once; a dead peer within its timeout).
    if (watch_thread_.joinable()) watch_thread_.join();
    for (Lane l : {Lane::kCompute, Lane::kH2D, Lane::kD2H, Lane::kComm}) {
      (void)dev_->SynchronizeLane(l);
    }
    dev_->SetObserver(nullptr);
    if (collective_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const CommHandle& h : ag_handle_) (void)h.Wait();
        for (const CommHandle& h : rs_handle_) (void)h.Wait();
      }
      comm_->SetObserver(nullptr);
      host_comm_->SetObserver(nullptr);
    }
    for (DevBuf& d : dbufs_) {
      if (d.ptr) (void)dev_->Free(d.ptr);
    }
    if (registered_with_device_) (void)dev_->UnregisterHostMemory(pool_->base());
  }
  store_.reset();
  (void)timeline_.CloseTrace();
}

void EngineImpl::OnDeviceOp(const DeviceOpRecord& r) {
  TraceLane lane;
  switch (r.lane) {
    case Lane::kCompute:
      lane = TraceLane::kCompute;
      break;
    case Lane::kH2D:
      lane = TraceLane::kH2D;
      break;
    case Lane::kD2H:
      lane = TraceLane::kD2H;
      break;
    default:
      return;
  }
  // Bookkeeping host functions on the copy lanes are not transfers; leave them out of the
  // busy time of the link.
  if (lane != TraceLane::kCompute && r.bytes == 0) return;
  timeline_.Add(lane, r.label, r.start, r.end, r.bytes);
}

// ---------------------------------------------------------------------------------------
// I/O thread
// ---------------------------------------------------------------------------------------

bool EngineImpl::TryHostOpLocked(const HostOp& op, std::vector<SwapOp>* reads,
                                 std::vector<int>* read_objs) {
  HostObj& h = objs_[op.obj];
  switch (op.kind) {
    case HostOpKind::kEvict: {
      if (h.uses_done < op.uses_before || h.res.state != S::kReady) return false;
      cache_used_ -= RoundUp(h.bytes, 4096);
      h.buf = nullptr;
      (void)h.res.To(S::kAbsent);
      cv_.notify_all();
      return true;
    }
    case HostOpKind::kLoad:
    case HostOpKind::kAlloc: {
      h.offset = op.offset;
      h.buf = cache_base_ + h.offset;
      cache_used_ += RoundUp(h.bytes, 4096);
      cache_peak_ = std::max(cache_peak_, cache_used_);
      // The plan never places two live objects on one range; a violation would corrupt
      // data silently, so it is checked (one pass over the objects per placement).
      for (int o = 0; o < int(objs_.size()); ++o) {
        const HostObj& x = objs_[o];
        if (o == op.obj || !x.cached || x.res.state == S::kAbsent) continue;
        if (x.offset < h.offset + RoundUp(h.bytes, 4096) &&
            h.offset < x.offset + RoundUp(x.bytes, 4096)) {
          SetErrorLocked(Status::Aborted("internal: host plan places " + Key(op.obj) +
                                         " over live " + Key(o)));
          return false;
        }
      }
      if (op.kind == HostOpKind::kAlloc || !h.on_nvme || !store_) {
        // Allocated for a use that writes it, or never written: zeros, as Create promised.
        if (op.kind == HostOpKind::kLoad || ObjComponent(op.obj) == Component::kParam) {
          std::memset(h.buf, 0, h.bytes);
        }
        (void)h.res.To(S::kReady);
        cv_.notify_all();
        return true;
      }
      (void)h.res.To(S::kLoading);
      reads->push_back(SwapOp{IoOp::kRead, Key(op.obj), h.buf, h.bytes});
      read_objs->push_back(op.obj);
      return true;
    }
  }
  return false;
}

void EngineImpl::IoLoop() {
  struct InFlight {
    int obj;
    bool write;
    Clock::time_point start;
  };
  std::unordered_map<SwapTicket, InFlight> in_flight;
  std::vector<SwapCompletion> done(64);
  for (;;) {
    std::vector<SwapOp> ops;
    std::vector<int> op_objs;
    std::vector<bool> op_write;
    {
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        if (shutdown_ && in_flight.empty()) return;
        bool progressed = false;
        if (error_.ok() && !shutdown_) {
          while (!write_queue_.empty()) {
            const int obj = write_queue_.front();
            write_queue_.pop_front();
            HostObj& h = objs_[obj];
            (void)h.res.To(S::kWriting);
            ops.push_back(SwapOp{IoOp::kWrite, Key(obj), h.buf, h.bytes});
            op_objs.push_back(obj);
            op_write.push_back(true);
            ++writes_in_flight_;
          }
          while (step_open_ && host_cursor_ < hplan_.ops.size()) {
            const size_t before = ops.size();
            if (!TryHostOpLocked(hplan_.ops[host_cursor_], &ops, &op_objs)) break;
            op_write.resize(ops.size(), false);
            (void)before;
            ++host_cursor_;
            progressed = true;
          }
        }
        if (progressed) cv_.notify_all();
        if (!ops.empty() || !in_flight.empty()) break;
        if (progressed) continue;
        cv_.wait(lk);
      }
    }
    if (!ops.empty()) {
      const Clock::time_point now = Clock::now();
      auto tickets = store_ ? store_->Submit(ops)
                            : Result<std::vector<SwapTicket>>(
                                  Status::Aborted("internal: NVMe operation without a store"));
      if (!tickets.ok()) {
        SetError(Status(tickets.status()).Annotate("submitting NVMe I/O"));
        continue;
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        in_flight[(*tickets)[i]] = InFlight{op_objs[i], op_write[i], now};
      }
    }
    if (in_flight.empty()) continue;
    auto n = store_->Poll(std::span<SwapCompletion>(done), 1);
    const Clock::time_point now = Clock::now();
    if (!n.ok()) {
      SetError(Status(n.status()).Annotate("waiting for NVMe I/O"));
      // The backend failed: nothing more will complete.
      in_flight.clear();
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < *n; ++i) {
      SwapCompletion& c = done[i];
      auto it = in_flight.find(c.ticket);
      if (it == in_flight.end()) continue;
      const InFlight f = it->second;
      in_flight.erase(it);
      HostObj& h = objs_[f.obj];
      timeline_.Add(f.write ? TraceLane::kNvmeWrite : TraceLane::kNvmeRead,
                    (f.write ? "write " : "read ") + Key(f.obj), f.start, now, h.bytes);
      if (!c.status.ok()) {
        SetErrorLocked(Status(c.status).Annotate(std::string(f.write ? "writing " : "reading ") +
                                                 ObjName(f.obj) + " (key " + Key(f.obj) + ")"));
        if (f.write) --writes_in_flight_;
        continue;
      }
      if (f.write) {
        --writes_in_flight_;
        h.on_nvme = true;
      }
      (void)h.res.To(S::kReady);
    }
    cv_.notify_all();
  }
}

// ---------------------------------------------------------------------------------------
// Device feeder
// ---------------------------------------------------------------------------------------

Status EngineImpl::RunFeederAccess(int a) {
  const DevStep& ds = dplan_.steps[a];
  const Access& acc = schedule_[a];
  const int b = acc.block;
  for (int f : ds.frees) {
    EventPtr last;
    void* ptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] {
        return model_pos_ > dbufs_[f].last_access &&
               (!dplan_.buffers[f].grad || dbufs_[f].landing_enqueued);
      }));
      last = dbufs_[f].last;
      ptr = dbufs_[f].ptr;
    }
    if (last) STRATA_RETURN_IF_ERROR(last->Synchronize());
    STRATA_RETURN_IF_ERROR(dev_->Free(ptr));
    std::lock_guard<std::mutex> lock(mu_);
    dbufs_[f].ptr = nullptr;
    (void)dbufs_[f].res.To(S::kAbsent);
    dev_used_ -= dplan_.buffers[f].bytes;
  }
  auto allocate = [&](int id) -> Status {
    auto p = dev_->Allocate(dplan_.buffers[id].bytes);
    if (!p.ok()) return Status(p.status()).Annotate("device memory for block " + std::to_string(b));
    std::lock_guard<std::mutex> lock(mu_);
    dbufs_[id].ptr = *p;
    dev_used_ += dplan_.buffers[id].bytes;
    dev_peak_ = std::max(dev_peak_, dev_used_);
    return Status::OK();
  };
  if (ds.load && collective_ && !device_collectives_) {
    // Host memory: the comm thread entered the shard and issued its all-gather into a
    // gather buffer; the H2D lane waits for the gather, copies the full block, then frees
    // both.
    const int obj = hplan_.uses[hplan_.h2d_use[a]].objs[0].obj;
    STRATA_RETURN_IF_ERROR(allocate(ds.param_buffer));
    CommHandle gathered;
    int slot;
    {
      std::unique_lock<std::mutex> lk(mu_);
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] { return bool(ag_issued_[a]); }));
      gathered = ag_handle_[a];
      slot = ag_slot_[a];
      (void)dbufs_[ds.param_buffer].res.To(S::kLoading);
    }
    DevBuf& d = dbufs_[ds.param_buffer];
    STRATA_RETURN_IF_ERROR(dev_->EnqueueHostFunction(
        Lane::kH2D,
        [this, gathered] {
          Status st = gathered.Wait();
          if (!st.ok()) SetError(st);
          return st;
        },
        "wait all-gather"));
    STRATA_RETURN_IF_ERROR(
        dev_->CopyToDevice(d.ptr, gather_[slot], param_bytes_[b], "h2d " + layout_[b].name));
    STRATA_RETURN_IF_ERROR(dev_->EnqueueHostFunction(
        Lane::kH2D,
        [this, obj, slot] {
          std::lock_guard<std::mutex> lock(mu_);
          gather_busy_[slot] = false;
          return LeaveLocked(obj, false);
        },
        "h2d done"));
    STRATA_ASSIGN_OR_RETURN(EventPtr ev, dev_->Record(Lane::kH2D));
    std::lock_guard<std::mutex> lock(mu_);
    d.ready = std::move(ev);
    (void)d.res.To(S::kReady);
  } else if (ds.load) {
    const int use = hplan_.h2d_use[a];
    const UseObj uo = hplan_.uses[use].objs[0];
    STRATA_RETURN_IF_ERROR(allocate(ds.param_buffer));
    void* src;
    {
      std::unique_lock<std::mutex> lk(mu_);
      HostObj& h = objs_[uo.obj];
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] {
        return h.uses_done >= uo.seq && (h.res.state == S::kReady || h.res.state == S::kInUse);
      }));
      if (!h.res.Enter()) return Status::Aborted("internal: residency of " + ObjName(uo.obj));
      (void)dbufs_[ds.param_buffer].res.To(S::kLoading);
      src = h.buf;
    }
    DevBuf& d = dbufs_[ds.param_buffer];
    // This rank's shard into its slot of the block (one rank: the whole block). With
    // collectives in device memory, the comm thread then gathers the other slots in place.
    const uint64_t n = param_bytes_[b] / uint64_t(ws_);
    char* slot = static_cast<char*>(d.ptr) + uint64_t(rank_) * n;
    STRATA_RETURN_IF_ERROR(dev_->CopyToDevice(slot, src, n, "h2d " + layout_[b].name));
    const int obj = uo.obj;
    STRATA_RETURN_IF_ERROR(dev_->EnqueueHostFunction(
        Lane::kH2D,
        [this, obj] {
          std::lock_guard<std::mutex> lock(mu_);
          return LeaveLocked(obj, false);
        },
        "h2d done"));
    STRATA_ASSIGN_OR_RETURN(EventPtr ev, dev_->Record(Lane::kH2D));
    std::lock_guard<std::mutex> lock(mu_);
    if (collective_) {
      shard_h2d_[a] = std::move(ev);  // d.ready: the gather's event, set by the comm thread
    } else {
      d.ready = std::move(ev);
    }
    (void)d.res.To(S::kReady);
  }
  if (ds.grad_buffer >= 0) STRATA_RETURN_IF_ERROR(allocate(ds.grad_buffer));
  std::lock_guard<std::mutex> lock(mu_);
  feeder_pos_ = a + 1;
  cv_.notify_all();
  return Status::OK();
}

// Each step: wait for BeginStep, then run item(0), item(1), ... while i < count(). The first
// failure is stored and ends this worker's step (an Aborted after another failure is only
// that failure's echo, so it does not replace it).
void EngineImpl::RunStepWorker(const std::function<size_t()>& count,
                               const std::function<Status(size_t)>& item) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return shutdown_ || (step_open_ && generation_ != seen); });
      if (shutdown_) return;
      seen = generation_;
    }
    for (size_t i = 0; i < count(); ++i) {
      Status s = item(i);
      if (!s.ok()) {
        if (s.code() != StatusCode::kAborted || Error().ok()) SetError(s);
        break;
      }
    }
  }
}

void EngineImpl::FeederLoop() {
  RunStepWorker([this] { return schedule_.size(); },
                [this](size_t a) { return RunFeederAccess(int(a)); });
}

// ---------------------------------------------------------------------------------------
// Comm thread (with a communicator)
// ---------------------------------------------------------------------------------------

// The comm thread's collectives for the step, in the planner's order (PlanCommSequence).
void EngineImpl::BuildCommSequence() {
  CommSequenceOptions co;
  co.host_budget_unlimited = opt_.host_mem_bytes == 0;
  co.device_collectives = device_collectives_;
  comm_seq_ = PlanCommSequence(schedule_, dplan_, hplan_, co);
}

void EngineImpl::OnCommOp(const CommOpRecord& r) {
  const std::string label = r.label.empty() ? std::string(r.op) : std::string(r.label);
  timeline_.Add(TraceLane::kComm, label, r.start, r.end, r.bytes);
}

Result<EventPtr> EngineImpl::CollectiveDoneEvent(const CommHandle& h, const std::string& label) {
  if (!comm_->device_buffers()) {
    // A host communicator completes on its own worker: the lane waits for it there.
    STRATA_RETURN_IF_ERROR(dev_->EnqueueHostFunction(
        Lane::kComm, [h] { return h.Wait(); }, "wait " + label));
  }
  // A device communicator (NCCL) runs on this lane's stream: the event follows it.
  return dev_->Record(Lane::kComm);
}

Status EngineImpl::RunCommItem(size_t i) {
  const CommItem& item = comm_seq_[i];
  const int a = item.access;
  std::unique_lock<std::mutex> lk(mu_);
  if (device_collectives_ && item.kind != CommItem::kNorm) {
    const int b = schedule_[a].block;
    CollectiveOptions co;
    std::string label;
    CommHandle h;
    if (item.kind == CommItem::kGather) {
      // In place: this rank's slot (copied by the feeder) to every rank's.
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] { return shard_h2d_[a] != nullptr; }));
      char* block = static_cast<char*>(dbufs_[dplan_.steps[a].param_buffer].ptr);
      const uint64_t n = param_bytes_[b] / uint64_t(ws_);
      label = "all-gather " + layout_[b].name;
      co.label = label;
      co.after = shard_h2d_[a];
      lk.unlock();
      h = comm_->AllGather(block + uint64_t(rank_) * n, block, n, CommDataType::kByte, co);
    } else {
      // In place: the average of every rank's gradient, this rank's shard at its slot.
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] { return rs_after_[a] != nullptr; }));
      float* grad = static_cast<float*>(dbufs_[dplan_.steps[a].grad_buffer].ptr);
      const uint64_t n = layout_[b].shard_numel;
      label = "reduce-scatter " + layout_[b].name;
      co.label = label;
      co.after = rs_after_[a];
      lk.unlock();
      h = comm_->ReduceScatter(grad, grad + uint64_t(rank_) * n, n, CommDataType::kFloat32,
                               ReduceOp::kAverage, co);
    }
    Result<EventPtr> done = CollectiveDoneEvent(h, label);
    lk.lock();
    WatchLocked(h);
    if (!done.ok()) return done.status();
    if (item.kind == CommItem::kGather) {
      dbufs_[dplan_.steps[a].param_buffer].ready = *done;
      ag_handle_[a] = h;
      ag_issued_[a] = true;
    } else {
      rs_done_[a] = *done;
      rs_handle_[a] = h;
      rs_issued_[a] = true;
    }
    comm_pos_ = i + 1;
    cv_.notify_all();
    return Status::OK();
  }
  switch (item.kind) {
    case CommItem::kGather: {
      const UseObj uo = hplan_.uses[hplan_.h2d_use[a]].objs[0];
      HostObj& h = objs_[uo.obj];
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] {
        return !gather_busy_[item.slot] && h.uses_done >= uo.seq &&
               (h.res.state == S::kReady || h.res.state == S::kInUse);
      }));
      if (!h.res.Enter()) return Status::Aborted("internal: residency of " + ObjName(uo.obj));
      gather_busy_[item.slot] = true;
      const int b = schedule_[a].block;
      const std::string label = "all-gather " + layout_[b].name;
      CollectiveOptions co;
      co.label = label;
      // Bytes: the working dtype's shard (fp32 or bf16), no arithmetic.
      ag_handle_[a] = comm_->AllGather(h.buf, gather_[item.slot], h.bytes, CommDataType::kByte, co);
      WatchLocked(ag_handle_[a]);
      ag_slot_[a] = item.slot;
      ag_issued_[a] = true;
      break;
    }
    case CommItem::kReduce: {
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] { return rs_after_[a] != nullptr; }));
      const int b = schedule_[a].block;
      const std::string label = "reduce-scatter " + layout_[b].name;
      CollectiveOptions co;
      co.label = label;
      co.after = rs_after_[a];
      // Every rank's loss is the mean over its rows: the global gradient is the average.
      rs_handle_[a] = comm_->ReduceScatter(grad_full_, rs_dst_[a], layout_[b].shard_numel,
                                           CommDataType::kFloat32, ReduceOp::kAverage, co);
      WatchLocked(rs_handle_[a]);
      rs_issued_[a] = true;
      break;
    }
    case CommItem::kNorm: {
      STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] {
        for (int x = 0; x < L_; ++x) {
          if (!norm_known_[x]) return false;
        }
        return true;
      }));
      // This rank's sum in block order, then the ranks' sums in rank order: exact doubles
      // gathered as bytes, so every rank computes the same norm bit for bit.
      struct Part {
        double sum_squares;
        uint64_t non_finite;
      };
      Part mine{0, 0};
      for (int x = 0; x < L_; ++x)
        mine.sum_squares += norm_sq_[x], mine.non_finite += non_finite_[x];
      std::vector<Part> all(static_cast<size_t>(ws_));
      lk.unlock();
      CollectiveOptions co;
      co.label = "all-gather grad norm";
      Status st =
          host_comm_->AllGather(&mine, all.data(), sizeof(Part), CommDataType::kByte, co).Wait();
      lk.lock();
      if (!st.ok()) return st.Annotate("gradient norm across ranks");
      double sum = 0;
      uint64_t bad = 0;
      for (const Part& p : all) sum += p.sum_squares, bad += p.non_finite;
      grad_norm_ = std::sqrt(sum) * args_.grad_scale;
      if (opt_.grad_clip > 0) {
        skip_update_ = bad > 0;
        clip_coef_ = grad_norm_ > opt_.grad_clip ? opt_.grad_clip / (grad_norm_ + 1e-6) : 1.0;
      }
      norm_final_ = true;
      break;
    }
  }
  comm_pos_ = i + 1;
  cv_.notify_all();
  return Status::OK();
}

// Compares, across ranks, every option that fixes the order or the sizes of the collectives
// or changes the numbers (a rank with other optimizer settings would silently diverge):
// each rank contributes one fixed-size row of values; every rank finds the same first
// difference, so they all fail with the same message.
Status EngineImpl::CheckOptionsAgreeAcrossRanks() {
  // FNV-1a over the bytes of the model description and the schedule.
  uint64_t model_hash = 1469598103934665603ull, schedule_hash = model_hash;
  auto mix = [](uint64_t* h, const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      *h = (*h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
    }
  };
  for (const BlockLayout& b : layout_) {
    mix(&model_hash, b.name.data(), b.name.size() + 1);
    for (const TensorLayout& t : b.tensors) {
      mix(&model_hash, t.name.data(), t.name.size() + 1);
      for (int64_t d : t.shape) mix(&model_hash, &d, sizeof d);
      mix(&model_hash, &t.offset, sizeof t.offset);
      const uint8_t wd = t.weight_decay;
      mix(&model_hash, &wd, 1);
    }
  }
  for (const ScheduleEntry& e : opt_.schedule) {
    mix(&schedule_hash, &e.block, sizeof e.block);
    const uint8_t pass = uint8_t(e.pass);
    mix(&schedule_hash, &pass, 1);
  }
  const WorkingDtype dtype =
      opt_.dtype != WorkingDtype::kAuto
          ? opt_.dtype
          : (dev_->Kind() == DeviceKind::kCuda ? WorkingDtype::kBf16 : WorkingDtype::kFp32);
  enum Shown : uint8_t { kNumber, kReal, kHash, kDtype, kMemory, kOptimizer };
  struct Field {
    const char* name;
    uint64_t value;
    Shown shown;
  };
  auto real = [](double d) { return std::bit_cast<uint64_t>(d); };
  const Field fields[] = {
      {"the model (blocks, tensor names, shapes, weight decay)", model_hash, kHash},
      {"tensor_alignment", opt_.tensor_alignment, kNumber},
      {"schedule", schedule_hash, kHash},
      {"micro_batches", uint64_t(opt_.micro_batches), kNumber},
      {"device_mem_bytes (--device-mem)", opt_.device_mem_bytes, kNumber},
      {"host_mem_bytes (--host-mem)", opt_.host_mem_bytes, kNumber},
      {"the number of NVMe folders (--nvme)", opt_.nvme_paths.size(), kNumber},
      {"durable", uint64_t(opt_.durable), kNumber},
      {"resume", uint64_t(opt_.resume), kNumber},
      {"working dtype", uint64_t(dtype), kDtype},
      {"collective memory", uint64_t(opt_.collective_memory), kMemory},
      {"optimizer", uint64_t(opt_.optimizer), kOptimizer},
      {"beta1", real(opt_.beta1), kReal},
      {"beta2", real(opt_.beta2), kReal},
      {"eps", real(opt_.eps), kReal},
      {"weight_decay", real(opt_.weight_decay), kReal},
      {"grad_clip", real(opt_.grad_clip), kReal},
  };
  constexpr size_t kFields = sizeof fields / sizeof fields[0];
  std::vector<uint64_t> mine(kFields), all(kFields * size_t(ws_));
  for (size_t f = 0; f < kFields; ++f) mine[f] = fields[f].value;
  CollectiveOptions co;
  co.label = "all-gather engine options";
  STRATA_RETURN_IF_ERROR(
      host_comm_->AllGather(mine.data(), all.data(), kFields * 8, CommDataType::kByte, co)
          .Wait()
          .Annotate("comparing the engine options of the ranks"));
  auto show = [&](const Field& f, uint64_t v) -> std::string {
    switch (f.shown) {
      case kNumber:
        return std::to_string(v);
      case kReal: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", std::bit_cast<double>(v));
        return buf;
      }
      case kHash: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "hash %016llx", static_cast<unsigned long long>(v));
        return buf;
      }
      case kDtype:
        return WorkingDtypeName(WorkingDtype(v));
      case kMemory:
        return CollectiveMemoryName(CollectiveMemory(v));
      case kOptimizer:
        return v == uint64_t(OptimizerKind::kAdamW) ? "adamw" : "adam";
    }
    return "?";
  };
  for (int r = 1; r < ws_; ++r) {
    for (size_t f = 0; f < kFields; ++f) {
      const uint64_t v0 = all[f], vr = all[size_t(r) * kFields + f];
      if (v0 == vr) continue;
      return Status::InvalidArgument(
          std::string("the ranks' engine options differ: ") + fields[f].name + " is " +
          show(fields[f], v0) + " on rank 0 but " + show(fields[f], vr) + " on rank " +
          std::to_string(r) +
          "; every rank must run the same model with the same options (budgets included: "
          "they fix the order of the collectives)");
    }
  }
  return Status::OK();
}

void EngineImpl::CommLoop() {
  RunStepWorker([this] { return comm_seq_.size(); }, [this](size_t i) { return RunCommItem(i); });
}

void EngineImpl::WatchLoop() {
  for (;;) {
    CommHandle h;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return shutdown_ || !watch_.empty(); });
      if (watch_.empty()) return;  // shut down, everything waited for
      h = watch_.front();
      watch_.pop_front();
    }
    Status s = h.Wait();
    // An Aborted after another failure is only its echo (a broken communicator).
    if (!s.ok() && (s.code() != StatusCode::kAborted || Error().ok())) SetError(s);
  }
}

// ---------------------------------------------------------------------------------------
// Optimizer worker
// ---------------------------------------------------------------------------------------

Status EngineImpl::RunOptimizer(int use_index) {
  const HostUse& u = hplan_.uses[use_index];
  const int b = u.block;
  const int g = ObjIndex(b, Component::kGrad);
  {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      // Norms of blocks whose gradient is final, computed while waiting (clipping needs all).
      int pending_norm = -1;
      for (int x = 0; x < L_ && pending_norm < 0; ++x) {
        if (!norm_known_[x] && grads_in_[x] == opt_.micro_batches) pending_norm = x;
      }
      if (pending_norm >= 0) {
        const int gx = ObjIndex(pending_norm, Component::kGrad);
        const float* grad = static_cast<const float*>(objs_[gx].buf);
        const size_t n = layout_[pending_norm].shard_numel;
        lk.unlock();
        const Clock::time_point t0 = Clock::now();
        auto r = GradNormSquared(grad, FloatFormat::kFp32, n, kernel_options_);
        timeline_.Add(TraceLane::kCpuOptim, "norm " + layout_[pending_norm].name, t0, Clock::now());
        lk.lock();
        if (!r.ok()) return Status(r.status()).Annotate("gradient norm");
        norm_sq_[pending_norm] = r->sum_squares;
        non_finite_[pending_norm] = r->non_finite;
        norm_known_[pending_norm] = true;
        cv_.notify_all();  // the comm thread combines the norms once all are known
        continue;
      }
      if (!error_.ok()) return error_;
      if (shutdown_) return Status::Aborted("engine is shutting down");
      bool ready = grads_in_[b] == opt_.micro_batches && norm_known_[b];
      for (const UseObj& uo : u.objs) {
        const HostObj& h = objs_[uo.obj];
        if (!h.exists) continue;
        ready = ready && h.uses_done >= uo.seq &&
                (h.res.state == S::kReady || h.res.state == S::kInUse);
      }
      if (ready && opt_.grad_clip > 0 && !norm_final_) {
        bool all = true;
        for (int x = 0; x < L_; ++x) all = all && norm_known_[x];
        if (all && collective_) {
          all = norm_final_;  // the comm thread combines the ranks' norms
        } else if (all) {
          // Fixed block order: the sum does not depend on which gradient landed first.
          double sum = 0;
          uint64_t bad = 0;
          for (int x = 0; x < L_; ++x) sum += norm_sq_[x], bad += non_finite_[x];
          grad_norm_ = std::sqrt(sum) * args_.grad_scale;
          skip_update_ = bad > 0;
          clip_coef_ = grad_norm_ > opt_.grad_clip ? opt_.grad_clip / (grad_norm_ + 1e-6) : 1.0;
          norm_final_ = true;
        }
        ready = all;
      }
      if (ready) break;
      cv_.wait(lk);
    }
    for (const UseObj& uo : u.objs) {
      if (objs_[uo.obj].exists && !objs_[uo.obj].res.Enter()) {
        return Status::Aborted("internal: residency of " + ObjName(uo.obj));
      }
    }
  }
  auto ptr = [&](Component c) { return objs_[ObjIndex(b, c)].buf; };
  float* master = static_cast<float*>(ptr(Component::kMaster));
  float* m = static_cast<float*>(ptr(Component::kExpAvg));
  float* v = static_cast<float*>(ptr(Component::kExpAvgSq));
  const float* grad = static_cast<const float*>(objs_[g].buf);
  uint16_t* param = separate_ ? static_cast<uint16_t*>(ptr(Component::kParam)) : nullptr;
  const Clock::time_point t0 = Clock::now();
  Status status;
  const bool apply = !(opt_.grad_clip > 0 && skip_update_);
  if (apply) {
    AdamHyperParams hp;
    hp.lr = args_.lr;
    hp.beta1 = opt_.beta1;
    hp.beta2 = opt_.beta2;
    hp.eps = opt_.eps;
    hp.step = resumed_step_ + step_;
    hp.mode = opt_.optimizer == OptimizerKind::kAdamW ? AdamMode::kAdamW : AdamMode::kAdam;
    const float scale = float(args_.grad_scale * (opt_.grad_clip > 0 ? clip_coef_ : 1.0));
    for (const TensorLayout& t : layout_[b].tensors) {
      // This rank's part of the tensor (all of it with one rank).
      const auto [lo, hi] = ShardPart(b, t.offset, t.offset + t.numel);
      if (lo == hi) continue;
      AdamSlice s;
      s.master = master + lo;
      s.exp_avg = m + lo;
      s.exp_avg_sq = v + lo;
      s.grad = grad + lo;
      s.n = hi - lo;
      if (param) {
        s.param_out = param + lo;
        s.param_out_format = ParamOut::kBf16;
      }
      hp.weight_decay = t.weight_decay ? opt_.weight_decay : 0.0;
      status = AdamStep(s, hp, scale, kernel_options_);
      if (!status.ok()) break;
    }
  }
  timeline_.Add(TraceLane::kCpuOptim, "adam " + layout_[b].name, t0, Clock::now(),
                layout_[b].shard_numel * 4);
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) return status.Annotate("optimizer step of block '" + layout_[b].name + "'");
  for (const UseObj& uo : u.objs) {
    if (!objs_[uo.obj].exists) continue;
    const bool modified = apply && uo.obj != g;
    STRATA_RETURN_IF_ERROR(LeaveLocked(uo.obj, modified));
  }
  ++opts_done_;
  cv_.notify_all();
  return Status::OK();
}

void EngineImpl::OptimizerLoop() {
  RunStepWorker([this] { return hplan_.opt_uses.size(); },
                [this](size_t k) { return RunOptimizer(hplan_.opt_uses[k]); });
}

// ---------------------------------------------------------------------------------------
// Step API (model thread)
// ---------------------------------------------------------------------------------------

Status EngineImpl::CommitLocked(std::unique_lock<std::mutex>& lk, uint64_t step) {
  if (!store_) return Status::OK();
  lk.unlock();
  Status s = store_->Commit(step);
  lk.lock();
  return s;
}

Status EngineImpl::BeginStep(const StepArgs& args) {
  std::unique_lock<std::mutex> lk(mu_);
  STRATA_RETURN_IF_ERROR(error_);
  if (step_open_) return Status::InvalidArgument("BeginStep: a step is already open");
  if (!(args.lr >= 0) || !std::isfinite(args.lr) || !(args.grad_scale > 0) ||
      !std::isfinite(args.grad_scale)) {
    return Status::InvalidArgument("BeginStep: lr must be >= 0 and grad_scale > 0 (lr " +
                                   std::to_string(args.lr) + ", grad_scale " +
                                   std::to_string(args.grad_scale) + ")");
  }
  if (params_dirty_ && store_ &&
      (!store_->CommittedStep() || int64_t(*store_->CommittedStep()) < step_ + resumed_step_)) {
    STRATA_RETURN_IF_ERROR(CommitLocked(lk, uint64_t(resumed_step_ + step_)));
  }
  params_dirty_ = false;
  HostPlanInput hin = HostInputFor(place_);
  for (int o = 0; o < int(objs_.size()); ++o) {
    if (objs_[o].cached && objs_[o].res.state != S::kAbsent) hin.start_resident.push_back(o);
  }
  for (int o = 0; o < int(objs_.size()); ++o) hin.start_offset[o] = objs_[o].offset;
  auto plan = PlanHost(hin);
  if (!plan.ok()) {
    // What the last step left in the cache can fragment it; start from an empty cache (the
    // configuration the planner validated) by evicting it first.
    std::vector<int> carried = hin.start_resident;
    hin.start_resident.clear();
    plan = PlanHost(hin);
    if (plan.ok()) {
      std::vector<HostOp> ops;
      for (int o : carried) ops.push_back(HostOp{HostOpKind::kEvict, o, -1, 0});
      ops.insert(ops.end(), plan->ops.begin(), plan->ops.end());
      plan->ops = std::move(ops);
    }
  }
  STRATA_ASSIGN_OR_RETURN(hplan_, std::move(plan));

  ++step_;
  args_ = args;
  dbufs_.assign(dplan_.buffers.size(), DevBuf{});
  for (int a = 0; a < int(schedule_.size()); ++a) {
    const DevStep& ds = dplan_.steps[a];
    dbufs_[ds.param_buffer].last_access = a;
    if (ds.grad_buffer >= 0) dbufs_[ds.grad_buffer].last_access = a;
  }
  dev_used_ = dev_peak_ = 0;
  model_pos_ = 0;
  acquired_ = -1;
  feeder_pos_ = 0;
  host_cursor_ = 0;
  opts_done_ = 0;
  total_uses_ = 0;
  for (const HostUse& u : hplan_.uses) {
    for (const UseObj& uo : u.objs) total_uses_ += objs_[uo.obj].exists ? 1 : 0;
  }
  uses_completed_ = 0;
  for (HostObj& h : objs_) h.uses_done = 0;
  grads_in_.assign(L_, 0);
  norm_sq_.assign(L_, 0);
  non_finite_.assign(L_, 0);
  norm_known_.assign(L_, false);
  grad_norm_ = 0;
  clip_coef_ = 1;
  skip_update_ = false;
  norm_final_ = false;
  pool_->ResetPeak();
  cache_peak_ = cache_used_;
  step_start_ = Clock::now();
  timeline_.BeginStep(step_start_);
  const int64_t step_number = resumed_step_ + step_;  // the one beginning (counted above)
  timeline_.SetTraceRecording(step_number >= opt_.trace_first_step &&
                              (opt_.trace_last_step == 0 || step_number <= opt_.trace_last_step));
  if (collective_) {
    BuildCommSequence();
    const size_t n = schedule_.size();
    comm_pos_ = 0;
    gather_busy_[0] = gather_busy_[1] = false;
    ag_issued_.assign(n, false);
    ag_handle_.assign(n, CommHandle());
    ag_slot_.assign(n, 0);
    rs_after_.assign(n, nullptr);
    rs_dst_.assign(n, nullptr);
    rs_issued_.assign(n, false);
    rs_handle_.assign(n, CommHandle());
    shard_h2d_.assign(n, nullptr);
    rs_done_.assign(n, nullptr);
  }
  step_open_ = true;
  ++generation_;
  cv_.notify_all();
  return Status::OK();
}

Result<BlockView> EngineImpl::Acquire(int block, Pass pass) {
  EventPtr ready;
  int a;
  {
    std::unique_lock<std::mutex> lk(mu_);
    STRATA_RETURN_IF_ERROR(error_);
    if (!step_open_) return Status::InvalidArgument("Acquire outside a step (call BeginStep)");
    if (acquired_ >= 0) {
      return Status::InvalidArgument("Acquire of block " + std::to_string(block) + " while block " +
                                     std::to_string(schedule_[acquired_].block) +
                                     " is still acquired (Release it first)");
    }
    a = model_pos_;
    const Access want{block, pass, a < int(schedule_.size()) ? schedule_[a].micro : 0};
    if (a >= int(schedule_.size()) || !(schedule_[a] == want)) {
      return Status::InvalidArgument(
          "Acquire(" + std::to_string(block) + ", " +
          (pass == Pass::kForward ? "forward" : "backward") + ") is access " + std::to_string(a) +
          " of the step, but the schedule expects " +
          (a < int(schedule_.size()) ? DescribeAccess(schedule_[a]) : std::string("EndStep")) +
          (opt_.schedule.empty() ? " (per micro-batch: forward 0..L-1, then backward L-1..0)"
                                 : " (EngineOptions::schedule)"));
    }
    // In device memory the block is ready once its all-gather is issued too.
    STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] {
      return feeder_pos_ > a && (!device_collectives_ || !dplan_.steps[a].load || ag_issued_[a]);
    }));
    DevBuf& d = dbufs_[dplan_.steps[a].param_buffer];
    if (!d.res.Enter()) return Status::Aborted("internal: device residency");
    ready = d.ready;
    acquired_ = a;
    grads_submitted_ = false;
  }
  // Compute enqueued from now on runs after the copy (no host wait).
  if (ready) STRATA_RETURN_IF_ERROR(dev_->WaitEvent(Lane::kCompute, ready));
  BlockView view;
  view.block = block;
  view.params = dbufs_[dplan_.steps[a].param_buffer].ptr;
  view.dtype = dtype_;
  view.layout = &layout_[block];
  return view;
}

Status EngineImpl::Release(int block) {
  std::unique_lock<std::mutex> lk(mu_);
  if (acquired_ < 0 || schedule_[acquired_].block != block) {
    return Status::InvalidArgument("Release of block " + std::to_string(block) +
                                   ", which is not acquired");
  }
  const int a = acquired_;
  if (schedule_[a].pass == Pass::kBackward && !grads_submitted_) {
    return Status::InvalidArgument("Release of block " + std::to_string(block) +
                                   " in backward before SubmitGrads");
  }
  lk.unlock();
  auto ev = dev_->Record(Lane::kCompute);
  lk.lock();
  if (!ev.ok()) {
    SetErrorLocked(ev.status());
    return ev.status();
  }
  DevBuf& d = dbufs_[dplan_.steps[a].param_buffer];
  d.last = *ev;
  (void)d.res.Leave(false, false);
  acquired_ = -1;
  model_pos_ = a + 1;
  cv_.notify_all();
  return error_;
}

Result<float*> EngineImpl::GradBuffer(int block) {
  std::lock_guard<std::mutex> lock(mu_);
  if (acquired_ < 0 || schedule_[acquired_].block != block ||
      schedule_[acquired_].pass != Pass::kBackward) {
    return Status::InvalidArgument("GradBuffer(" + std::to_string(block) +
                                   ") needs the block acquired for backward");
  }
  return static_cast<float*>(dbufs_[dplan_.steps[acquired_].grad_buffer].ptr);
}

Status EngineImpl::SubmitGrads(int block) {
  int a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    STRATA_RETURN_IF_ERROR(error_);
    if (acquired_ < 0 || schedule_[acquired_].block != block ||
        schedule_[acquired_].pass != Pass::kBackward || grads_submitted_) {
      return Status::InvalidArgument("SubmitGrads(" + std::to_string(block) +
                                     ") needs the block acquired for backward, once");
    }
    a = acquired_;
    grads_submitted_ = true;
  }
  // The landing (D2H copy into the host accumulator) is enqueued by the lander thread once
  // the host buffer is free, so the model never waits here for host memory.
  STRATA_ASSIGN_OR_RETURN(EventPtr computed, dev_->Record(Lane::kCompute));
  std::lock_guard<std::mutex> lock(mu_);
  if (device_collectives_) rs_after_[a] = computed;  // the reduce-scatter may start after it
  landings_.push_back(Landing{a, std::move(computed)});
  cv_.notify_all();
  return Status::OK();
}

Status EngineImpl::RunLanding(const Landing& l) {
  const int a = l.access;
  const int block = schedule_[a].block;
  int obj;
  bool first;
  void* dst;
  void* src;
  {
    std::unique_lock<std::mutex> lk(mu_);
    const UseObj uo = hplan_.uses[hplan_.grad_use[a]].objs[0];
    obj = uo.obj;
    first = uo.produce;
    HostObj& h = objs_[obj];
    STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] {
      return h.uses_done >= uo.seq && (h.res.state == S::kReady || h.res.state == S::kInUse);
    }));
    if (!h.res.Enter()) return Status::Aborted("internal: residency of " + ObjName(obj));
    dst = first ? h.buf : staging_;
    src = dbufs_[dplan_.steps[a].grad_buffer].ptr;
  }
  EventPtr after = l.computed;
  if (device_collectives_) {
    // The copy takes this rank's shard of the averaged gradient, after the reduce-scatter.
    std::unique_lock<std::mutex> lk(mu_);
    STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] { return bool(rs_issued_[a]); }));
    after = rs_done_[a];
  }
  STRATA_RETURN_IF_ERROR(dev_->WaitEvent(Lane::kD2H, after));
  const uint64_t bytes = objs_[obj].bytes;
  if (collective_ && !device_collectives_) {
    // The full block lands in grad_full_; the comm thread's reduce-scatter (ordered after
    // this copy) averages it over the ranks into `dst`. The D2H lane waits for it before
    // accumulating, which also keeps the next landing out of grad_full_ until it is read.
    STRATA_RETURN_IF_ERROR(
        dev_->CopyToHost(grad_full_, src, grad_bytes_[block], "d2h grad " + layout_[block].name));
    STRATA_ASSIGN_OR_RETURN(EventPtr copied, dev_->Record(Lane::kD2H));
    {
      std::lock_guard<std::mutex> lock(mu_);
      rs_dst_[a] = dst;
      rs_after_[a] = copied;
      // The device buffer is free once copied out: freeing it must not wait for the
      // reduce-scatter (which may be ordered after the next gathers, whose H2D copies
      // wait for device memory).
      dbufs_[dplan_.steps[a].grad_buffer].last = std::move(copied);
      cv_.notify_all();
    }
    STRATA_RETURN_IF_ERROR(dev_->EnqueueHostFunction(
        Lane::kD2H,
        [this, a] {
          CommHandle reduced;
          {
            std::unique_lock<std::mutex> lk(mu_);
            STRATA_RETURN_IF_ERROR(WaitLocked(lk, [&] { return bool(rs_issued_[a]); }));
            reduced = rs_handle_[a];
          }
          Status st = reduced.Wait();
          if (!st.ok()) SetError(st);
          return st;
        },
        "wait reduce-scatter"));
  } else {
    // This rank's shard (one rank: the whole block).
    const char* shard = static_cast<const char*>(src) + uint64_t(rank_) * bytes;
    STRATA_RETURN_IF_ERROR(dev_->CopyToHost(dst, shard, bytes, "d2h grad " + layout_[block].name));
  }
  const BlockLayout* bl = &layout_[block];
  float* acc = static_cast<float*>(objs_[obj].buf);
  const float* landed = static_cast<const float*>(staging_);
  STRATA_RETURN_IF_ERROR(dev_->EnqueueHostFunction(
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
          const auto [lo, hi] = ShardPart(block, begin, end);
          if (lo < hi) std::memset(acc + lo, 0, (hi - lo) * sizeof(float));
        };
        for (const TensorLayout& t : bl->tensors) {
          if (t.offset > pos) zero(pos, t.offset);
          pos = t.offset + t.numel;
        }
        if (bl->padded_numel > pos) zero(pos, bl->padded_numel);

        std::lock_guard<std::mutex> lock(mu_);
        ++grads_in_[block];
        return LeaveLocked(obj, false);
      },
      "grad landed"));
  STRATA_ASSIGN_OR_RETURN(EventPtr landed_ev, dev_->Record(Lane::kD2H));
  std::lock_guard<std::mutex> lock(mu_);
  DevBuf& d = dbufs_[dplan_.steps[a].grad_buffer];
  if (!collective_ || device_collectives_) d.last = std::move(landed_ev);
  d.landing_enqueued = true;
  cv_.notify_all();
  return Status::OK();
}

void EngineImpl::LanderLoop() {
  for (;;) {
    Landing l;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return shutdown_ || !landings_.empty(); });
      if (landings_.empty()) return;  // shutdown
      l = std::move(landings_.front());
      landings_.pop_front();
    }
    Status s = RunLanding(l);
    if (!s.ok() && (s.code() != StatusCode::kAborted || Error().ok())) SetError(s);
  }
}

Result<StepStats> EngineImpl::EndStep() {
  std::unique_lock<std::mutex> lk(mu_);
  if (!step_open_) return Status::InvalidArgument("EndStep without BeginStep");
  if (error_.ok() && model_pos_ != int(schedule_.size())) {
    return Status::InvalidArgument("EndStep after " + std::to_string(model_pos_) + " of " +
                                   std::to_string(schedule_.size()) +
                                   " accesses; the step is incomplete");
  }
  Status s = WaitLocked(lk, [&] {
    return opts_done_ == hplan_.opt_uses.size() && host_cursor_ == hplan_.ops.size() &&
           feeder_pos_ == int(schedule_.size()) && write_queue_.empty() && writes_in_flight_ == 0 &&
           uses_completed_ == total_uses_ && comm_pos_ == comm_seq_.size();
  });
  if (!s.ok()) {
    step_open_ = false;
    return s;
  }
  lk.unlock();
  // Updates made every device copy stale: free them (their last users are done by now,
  // since every gradient has landed; synchronise anyway for the forward-only buffers).
  Status sync = dev_->SynchronizeLane(Lane::kCompute);
  for (DevBuf& d : dbufs_) {
    if (d.ptr) {
      Status f = dev_->Free(d.ptr);
      if (sync.ok()) sync = f;
      d.ptr = nullptr;
    }
  }
  lk.lock();
  dev_used_ = 0;
  step_open_ = false;
  if (!sync.ok()) {
    SetErrorLocked(sync);
    return sync;
  }
  const uint64_t step_number = uint64_t(resumed_step_ + step_);
  // The commit flushes the drives (fdatasync) and writes the manifest: NVMe write time.
  const Clock::time_point commit_start = Clock::now();
  s = CommitLocked(lk, step_number);
  if (store_) {
    timeline_.Add(TraceLane::kNvmeWrite, "commit step " + std::to_string(step_number), commit_start,
                  Clock::now());
  }
  if (!s.ok()) {
    SetErrorLocked(Status(s).Annotate("committing step " + std::to_string(step_number)));
    return error_;
  }
  const Clock::time_point end = Clock::now();
  StepStats st;
  st.step = int64_t(step_number);
  st.seconds = std::chrono::duration<double>(end - step_start_).count();
  timeline_.StepUsage(step_start_, end, &st);  // busy table, bound, per-edge bytes
  Clock::time_point last_compute;
  st.stall_seconds = timeline_.ComputeIdleSeconds(step_start_, end, &last_compute);
  timeline_.AddStallEvents(step_start_, last_compute);
  timeline_.Add(TraceLane::kStep, "step " + std::to_string(step_number), step_start_, end);
  st.efficiency = st.seconds > 0 ? st.bound_seconds / st.seconds : 0;
  if (opt_.grad_clip > 0 || collective_) {  // combined by the optimizer or the comm thread
    st.grad_norm = grad_norm_;
    st.clip_coef = clip_coef_;
    st.skipped = skip_update_;
  } else {
    double sum = 0;
    for (int x = 0; x < L_; ++x) sum += norm_sq_[x];
    st.grad_norm = std::sqrt(sum) * args_.grad_scale;
  }
  st.peak_device_bytes = dev_peak_;
  st.peak_host_bytes = host_fixed_ + cache_peak_;
  return st;
}

// ---------------------------------------------------------------------------------------
// Parameters between steps
// ---------------------------------------------------------------------------------------

Status EngineImpl::CheckBlockTensor(int block, int tensor) const {
  if (block < 0 || block >= L_) {
    return Status::InvalidArgument("block " + std::to_string(block) + " out of range [0, " +
                                   std::to_string(L_) + ")");
  }
  if (tensor < 0 || tensor >= int(layout_[block].tensors.size())) {
    return Status::InvalidArgument("tensor " + std::to_string(tensor) +
                                   " out of range for block '" + layout_[block].name + "'");
  }
  return Status::OK();
}

Status EngineImpl::ReadObjLocked(int obj, void* dst) const {
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
  STRATA_RETURN_IF_ERROR(store_->Read(Key(obj), tmp.data, RoundUp(h.bytes, 4096)).status());
  std::memcpy(dst, tmp.data, h.bytes);
  return Status::OK();
}

Status EngineImpl::WriteParams(int block, int tensor, std::span<const float> values) {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, tensor));
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_RETURN_IF_ERROR(error_);
  if (step_open_) return Status::InvalidArgument("WriteParams during a step");
  const TensorLayout& t = layout_[block].tensors[tensor];
  if (values.size() != t.numel) {
    return Status::InvalidArgument("WriteParams: tensor '" + layout_[block].name + "." + t.name +
                                   "' has " + std::to_string(t.numel) + " elements, got " +
                                   std::to_string(values.size()));
  }
  std::vector<int> targets = {ObjIndex(block, Component::kMaster)};
  if (separate_) targets.push_back(ObjIndex(block, Component::kParam));
  for (int obj : targets) {
    HostObj& h = objs_[obj];
    const bool resident = h.buf && h.res.state == S::kReady;
    AlignedBuffer tmp(resident ? 0 : h.bytes);
    void* data = resident ? h.buf : tmp.data;
    if (!resident) STRATA_RETURN_IF_ERROR(ReadObjLocked(obj, data));
    // This rank's part of the tensor: values[k] is full-block element t.offset + k.
    const auto [lo, hi] = ShardPart(block, t.offset, t.offset + t.numel);
    const uint64_t first = lo + uint64_t(rank_) * layout_[block].shard_numel - t.offset;
    if (ObjComponent(obj) == Component::kParam) {
      uint16_t* p = static_cast<uint16_t*>(data) + lo;
      for (uint64_t i = 0; i < hi - lo; ++i) p[i] = FloatToBf16(values[first + i]);
    } else if (hi > lo) {
      std::memcpy(static_cast<float*>(data) + lo, values.data() + first, (hi - lo) * sizeof(float));
    }
    if (h.needs_write && store_) {
      STRATA_RETURN_IF_ERROR(store_->Write(Key(obj), data, h.bytes));
      h.on_nvme = true;
    }
  }
  params_dirty_ = true;
  return Status::OK();
}

Status EngineImpl::CommitParams() {
  std::unique_lock<std::mutex> lk(mu_);
  STRATA_RETURN_IF_ERROR(error_);
  if (step_open_) return Status::InvalidArgument("CommitParams during a step");
  if (!params_dirty_ || !store_) return Status::OK();
  const uint64_t step = uint64_t(resumed_step_ + step_);
  if (store_->CommittedStep() && *store_->CommittedStep() >= step) {
    return Status::InvalidArgument(
        "CommitParams: step " + std::to_string(step) +
        " is already committed; new values are committed with the next step");
  }
  STRATA_RETURN_IF_ERROR(CommitLocked(lk, step));
  params_dirty_ = false;
  return Status::OK();
}

Status EngineImpl::ReadParams(int block, int tensor, std::span<float> out) const {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, tensor));
  const TensorLayout& t = layout_[block].tensors[tensor];
  if (out.size() != t.numel) {
    return Status::InvalidArgument("ReadParams: tensor '" + layout_[block].name + "." + t.name +
                                   "' has " + std::to_string(t.numel) + " elements, got room for " +
                                   std::to_string(out.size()));
  }
  std::vector<float> shard(layout_[block].shard_numel);
  STRATA_RETURN_IF_ERROR(ReadComponent(block, Component::kMaster, shard));
  if (!collective_) {
    std::copy(shard.begin() + t.offset, shard.begin() + t.offset + t.numel, out.begin());
    return Status::OK();
  }
  // A collective: gather every rank's shard of the block.
  std::vector<float> all(layout_[block].padded_numel);
  CollectiveOptions co;
  co.label = "all-gather read params";
  STRATA_RETURN_IF_ERROR(
      host_comm_->AllGather(shard.data(), all.data(), shard.size(), CommDataType::kFloat32, co)
          .Wait()
          .Annotate("ReadParams of block '" + layout_[block].name + "'"));
  std::copy(all.begin() + t.offset, all.begin() + t.offset + t.numel, out.begin());
  return Status::OK();
}

Status EngineImpl::ReadComponent(int block, Component component, std::span<float> out) const {
  STRATA_RETURN_IF_ERROR(CheckBlockTensor(block, 0));
  if (component == Component::kGrad) {
    return Status::InvalidArgument("ReadComponent: gradients are freed after each update");
  }
  if (component == Component::kParam) component = Component::kMaster;
  std::lock_guard<std::mutex> lock(mu_);
  if (step_open_) return Status::InvalidArgument("ReadComponent during a step");
  const int obj = ObjIndex(block, component);
  if (out.size() != objs_[obj].bytes / 4) {
    return Status::InvalidArgument("ReadComponent: block '" + layout_[block].name + "' has " +
                                   std::to_string(objs_[obj].bytes / 4) +
                                   " elements, got room for " + std::to_string(out.size()));
  }
  return ReadObjLocked(obj, out.data());
}

}  // namespace
}  // namespace engine_internal

Result<std::unique_ptr<Engine>> Engine::Create(std::vector<BlockSpec> blocks,
                                               const EngineOptions& options) {
  EngineOptions opt = options;
  if (opt.comm) {
    if (opt.world_size != 1 && opt.world_size != opt.comm->world_size()) {
      return Status::InvalidArgument("EngineOptions::world_size " + std::to_string(opt.world_size) +
                                     " differs from the communicator's " +
                                     std::to_string(opt.comm->world_size()) +
                                     "; leave it at 1 (it is taken from the communicator)");
    }
    opt.world_size = opt.comm->world_size();
    opt.rank = opt.comm->rank();
    if (!opt.device) return Status::InvalidArgument("EngineOptions::device is required");
    const std::string backend = opt.comm->backend();
    if (opt.host_comm) {
      if (opt.host_comm->device_buffers()) {
        return Status::InvalidArgument(
            std::string("EngineOptions::host_comm must be a host-memory communicator (gloo), "
                        "not ") +
            opt.host_comm->backend());
      }
      if (opt.host_comm->world_size() != opt.world_size || opt.host_comm->rank() != opt.rank) {
        return Status::InvalidArgument(
            "EngineOptions::host_comm is rank " + std::to_string(opt.host_comm->rank()) + " of " +
            std::to_string(opt.host_comm->world_size()) + " but comm is rank " +
            std::to_string(opt.rank) + " of " + std::to_string(opt.world_size) +
            "; both must join the same ranks");
      }
    } else if (opt.comm->device_buffers()) {
      return Status::InvalidArgument(
          "EngineOptions::comm (" + backend +
          ") needs device buffers, but the engine's host-side collectives (the gradient norm, "
          "ReadParams) need host memory: set EngineOptions::host_comm to a host-memory "
          "communicator (gloo) over the same ranks");
    }
    // Whether the communicator can read and write the device's memory: NCCL reaches CUDA
    // memory; a host communicator reaches a HostDevice's, which is host memory.
    const bool cuda = opt.device->Kind() == DeviceKind::kCuda;
    if (opt.comm->device_buffers() && !cuda) {
      return Status::InvalidArgument("EngineOptions::comm (" + backend +
                                     ") works on CUDA device memory; this device is " +
                                     opt.device->Name() + " (use a gloo communicator)");
    }
    const bool reaches_device = opt.comm->device_buffers() == cuda;
    if (opt.collective_memory == CollectiveMemory::kAuto) {
      opt.collective_memory = reaches_device ? CollectiveMemory::kDevice : CollectiveMemory::kHost;
    } else if (opt.collective_memory == CollectiveMemory::kDevice && !reaches_device) {
      return Status::InvalidArgument(
          "collective memory 'device': a " + backend +
          " communicator cannot reach CUDA device memory; use an NCCL communicator for comm "
          "(with gloo as host_comm) or collective memory 'host'");
    } else if (opt.collective_memory == CollectiveMemory::kHost && opt.comm->device_buffers()) {
      return Status::InvalidArgument("collective memory 'host': the " + backend +
                                     " communicator needs device buffers; use 'device' (or "
                                     "auto), or a gloo communicator");
    }
  } else if (opt.world_size != 1 || opt.rank != 0) {
    return Status::InvalidArgument("world_size " + std::to_string(opt.world_size) +
                                   " needs EngineOptions::comm (the communicator of the ranks)");
  }
  STRATA_ASSIGN_OR_RETURN(
      std::vector<BlockLayout> layout,
      engine_internal::ComputeLayout(blocks, opt.tensor_alignment, opt.world_size));
  auto engine = std::make_unique<engine_internal::EngineImpl>(opt, std::move(layout));
  STRATA_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace strata
