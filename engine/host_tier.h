// HostTier: the pinned host tier and the NVMe behind it. It owns the pinned pool, the host
// copy of every component (HostObj: its residency, its buffer, whether the store holds a
// version), the cache region the host plan places copies in, the SwapStore, and the write
// queue of updated components; its I/O thread runs the host plan (evict, load = NVMe read,
// allocate) in order and submits the writes.
//
// Threads: Init, the between-step calls and BeginStepLocked run on the model's thread
// with no step open; the I/O thread runs IoLoop; every other part enters and leaves host
// copies (EnterLocked/LeaveLocked) from its own thread.
// Lock: the fields below are guarded by the shared EngineContext::mu; the SwapStore and
// the pool are called without it (the store only from the I/O thread during a step, and
// from the model's thread between steps).
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/engine_context.h"
#include "engine/residency.h"
#include "io/pinned_pool.h"
#include "io/swap_store.h"

namespace strata::engine_internal {

// A block's host copies, by component (nullptr where a component does not exist).
using BlockBuffers = std::array<void*, kNumComponents>;

// One component of one block in host memory.
struct HostObj {
  // Fixed by the placement at Init.
  bool exists = false;       // the component exists (kParam only with a separate dtype)
  bool cached = false;       // lives in the cache (NVMe home, or a gradient), not at home
  bool needs_write = false;  // updates go to NVMe (NVMe home, or durable)
  uint64_t bytes = 0;        // logical bytes (shard elements x element size)
  // State of the pinned copy.
  Residency res;
  void* buf = nullptr;
  uint64_t offset = 0;  // place in the cache region (cached objects)
  int uses_done = 0;    // uses of this step completed
  // A final gradient whose norm the optimizer has not read yet: not evicted until it has (a
  // spilled gradient may otherwise leave memory between its landing and its update).
  bool norm_pending = false;
  // State of the NVMe copy: the store holds a version (else the content is zeros).
  bool on_nvme = false;
};

class HostTier {
 public:
  explicit HostTier(EngineContext& ctx) : ctx_(ctx) {}
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Init, first part: the pinned pool (registered with a CUDA device) and the gradient
  // staging buffer. Allocate() works after it.
  Status InitPool();
  Result<void*> Allocate(uint64_t bytes, const std::string& name) {
    return pool_->Allocate(bytes, name);
  }
  // The whole pool, for another backend's RegisterBuffers (the activation stash's).
  BufferRegion PoolRegion() const { return BufferRegion{pool_->base(), pool_->size()}; }
  // Init, second part: the cache, the home copies, the SwapStore (and a resumed state).
  Status InitObjects() EXCLUDES(ctx_.mu);
  void Start() {
    io_thread_ = std::thread([this] { IoLoop(); });
  }
  void Join() {
    if (io_thread_.joinable()) io_thread_.join();
  }
  void UnregisterFromDevice();
  void CloseStore() { store_.reset(); }

  // ---- Step (mu held). ----
  // The host plan's start: the cached copies resident now and every copy's offset.
  void PlanStartLocked(std::vector<int>* resident, std::vector<uint64_t>* offsets) const
      REQUIRES(ctx_.mu);
  void BeginStepLocked() REQUIRES(ctx_.mu);
  // Every carried update ran (OptimizerStage): the home copies' writes, held since the step
  // began so the forward's loads for those updates had the drive, may go (the carried
  // commit waits for them).
  void ReleaseHomeWritesLocked() REQUIRES(ctx_.mu) {
    home_writes_held_ = false;
    ctx_.NotifyLocked();
  }
  // Every host op ran, every use completed, every write landed.
  bool StepDoneLocked() const REQUIRES(ctx_.mu) {
    return host_cursor_ == ctx_.hplan.ops.size() && write_queue_.empty() &&
           home_write_queue_.empty() && writes_in_flight_ == 0 && uses_completed_ == total_uses_;
  }
  uint64_t PeakBytesLocked() const REQUIRES(ctx_.mu) { return host_fixed_ + cache_peak_; }

  // ---- Uses of host copies, by any part (mu held). ----
  const HostObj& Obj(int obj) const REQUIRES(ctx_.mu) { return objs_[obj]; }
  // The copy may serve its `seq`-th use of the step: the uses before it are done and it is
  // in memory.
  bool UsableLocked(int obj, int seq) const REQUIRES(ctx_.mu) {
    const HostObj& h = objs_[obj];
    return h.uses_done >= seq &&
           (h.res.state == ResidencyState::kReady || h.res.state == ResidencyState::kInUse);
  }
  // The copy may serve its `seq`-th use of the step, a use that only reads it (an H2D copy):
  // as UsableLocked, or while it waits for its write to NVMe or that write is in flight (the
  // write reads it too). So the next forward's copy of a block waits for the block's update,
  // not for its write.
  bool ReadableLocked(int obj, int seq) const REQUIRES(ctx_.mu) {
    const HostObj& h = objs_[obj];
    return UsableLocked(obj, seq) ||
           (h.uses_done >= seq &&
            (h.res.state == ResidencyState::kWriting || h.res.state == ResidencyState::kDirty));
  }
  Status EnterLocked(int obj) REQUIRES(ctx_.mu);
  void SetNormPendingLocked(int obj, bool pending) REQUIRES(ctx_.mu) {
    objs_[obj].norm_pending = pending;
    if (!pending) ctx_.NotifyLocked();
  }
  // Ends a use; a modified copy that must reach NVMe joins the write queue.
  Status LeaveLocked(int obj, bool modified) REQUIRES(ctx_.mu);
  // Where a gradient lands for a micro-batch after the first.
  void* staging() const { return staging_; }

  // ---- Between steps (model thread, no step open). ----
  // Reads the whole component into `dst` (fp32 or bf16 bytes).
  Status ReadObjLocked(int obj, void* dst) const REQUIRES(ctx_.mu);
  // Writes the full-block elements [t.offset, t.offset + values.size()) of the block's
  // master (and working-dtype param) copies: this rank's part of them.
  Status WriteTensorLocked(int block, const TensorLayout& t, std::span<const float> values)
      REQUIRES(ctx_.mu);
  // Engine::WriteComponent: a whole component of this rank's shard of `block` (checks the
  // component and the size; kMaster through WriteTensorLocked, moments narrowed to bf16
  // (nearest even) with StateFormat::kBf16).
  Status WriteComponentLocked(int block, Component component, std::span<const float> values)
      REQUIRES(ctx_.mu);
  bool has_store() const { return store_ != nullptr; }
  std::optional<uint64_t> CommittedStep() const { return store_->CommittedStep(); }
  // Commits the store's pending versions as `step` (drops mu around the flush).
  Status CommitLocked(uint64_t step) REQUIRES(ctx_.mu);

  // ---- EndStep, once the step's work is done (model thread). ----
  // Where RollBackLocked takes the blocks' states from.
  enum class StatesFrom : uint8_t {
    kCommitted,  // the committed NVMe versions (zeros where none): undo a speculative update
    kCurrent,    // the host copies and the newest NVMe versions: an update not yet run
  };
  // Reruns the updates of `blocks` outside a step. With kCommitted (speculative updates the
  // norm invalidated): each block gets its states back from their committed versions and
  // then, with `redo`, is updated again (redo(block, buffers), its gradient included) and
  // written as the new pending version; without `redo` (a skipped step) the pending
  // versions are dropped. With kCurrent (the deferred updates of a pipelined step, run now):
  // each block is updated from its current states and written. Cached copies are evicted
  // first, but for `keep` (gradients still needed, in place); the blocks' objects are staged
  // in the cache region beside them (in plain aligned memory when those fragment it).
  Status RollBackLocked(const std::vector<int>& blocks, StatesFrom from,
                        const std::vector<int>& keep,
                        const std::function<Status(int, const BlockBuffers&)>& redo)
      REQUIRES(ctx_.mu);
  // Frees the gradients `objs` kept past their updates (HostPlan::held, a deferred step's).
  Status ReleaseLocked(const std::vector<int>& objs) REQUIRES(ctx_.mu);
  // Every updated state of `blocks` that goes to NVMe has been written.
  bool WritesLandedLocked(const std::vector<int>& blocks) const REQUIRES(ctx_.mu);
  // The bytes an update of each of `blocks` writes to NVMe (its states that go there).
  uint64_t UpdateWriteBytesLocked(const std::vector<int>& blocks) const REQUIRES(ctx_.mu);

 private:
  // The I/O thread's next submission: per operation its object; the home copies' writes
  // (home_write_queue_) come last, from home_from on.
  struct IoBatch {
    std::vector<SwapOp> ops;
    std::vector<int> objs;
    size_t home_from = 0;
  };
  void IoLoop() EXCLUDES(ctx_.mu);
  // Adds to `batch` what may start now: the cached copies' writes, the host plan's ops in
  // order, then the home copies' writes (see home_write_queue_). True when anything changed.
  bool GatherIoLocked(IoBatch* batch, int reads_in_flight, int home_writes_in_flight)
      REQUIRES(ctx_.mu);
  // Starts the write of `queue`'s front copy (none when that entry is stale); false (error
  // stored) on a refused transition.
  bool StartWriteLocked(std::deque<int>* queue, IoBatch* batch) REQUIRES(ctx_.mu);
  // Runs host op `op` if its dependencies are met; false when it must wait (or failed: then
  // the error is stored).
  bool TryHostOpLocked(const HostOp& op, std::vector<SwapOp>* reads, std::vector<int>* read_objs)
      REQUIRES(ctx_.mu);
  bool PlaceLocked(const HostOp& op) REQUIRES(ctx_.mu);
  Status ResumeFromStore() EXCLUDES(ctx_.mu);
  // At resume, with EngineOptions::convert_state_format: object o's moment, committed as
  // `stored_bytes` of another state format, decoded and written again in this engine's
  // (pending, committed with the next commit). Returns the format it had.
  Result<StateFormat> ConvertMoment(int o, uint64_t stored_bytes) EXCLUDES(ctx_.mu);
  // The layout of object o's block in the state format whose moment extent is `stored_bytes`
  // long, if one is (unambiguous: see ConvertMoment).
  std::optional<BlockStateLayout> StoredMomentLayout(int o, uint64_t stored_bytes) const;
  // At resume: object o, a master, committed with `stored_bytes`, the length of another
  // MasterFormat's extent: InvalidArgument naming both formats (no conversion is offered).
  Status CheckStoredMaster(int o, uint64_t stored_bytes) const;
  // RollBackLocked's work for one block, its objects' buffers in `bufs`.
  Status RestoreBlockLocked(int block, StatesFrom from, const BlockBuffers& bufs,
                            const std::function<Status(int, const BlockBuffers&)>& redo)
      REQUIRES(ctx_.mu);
  Status OpenStore() EXCLUDES(ctx_.mu);
  // Resume on another rank count (EngineOptions::reshard_from; engine/reshard.cc).
  Status ResumeResharded() EXCLUDES(ctx_.mu);

  EngineContext& ctx_;
  std::unique_ptr<PinnedPool> pool_;
  bool registered_with_device_ = false;
  std::unique_ptr<SwapStore> store_;
  uint64_t reshard_extra_capacity_ = 0;  // the old store's bytes, kept until the first commit
  uint64_t resharded_bytes_ = 0;         // this rank's new shards, read from the old stores
  void* staging_ = nullptr;  // gradient landing buffer for micro-batches after the first
  // The cache: one pinned region; the host plan places objects inside it (exact offsets, so
  // the simulated footprint and fragmentation are the real ones).
  char* cache_base_ = nullptr;
  uint64_t host_fixed_ = 0;  // staging and homes: the pool outside the cache

  std::vector<HostObj> objs_ GUARDED_BY(ctx_.mu);
  uint64_t cache_used_ GUARDED_BY(ctx_.mu) = 0;
  uint64_t cache_peak_ GUARDED_BY(ctx_.mu) = 0;
  size_t host_cursor_ GUARDED_BY(ctx_.mu) = 0;  // host plan ops run
  int64_t total_uses_ GUARDED_BY(ctx_.mu) = 0;
  int64_t uses_completed_ GUARDED_BY(ctx_.mu) = 0;
  // Dirty copies to write, in the order they became dirty: cached ones (their writes free
  // cache space, so the plan's loads wait for them) and home ones (only a commit waits for
  // them: they wait for the step's carried updates and for a moment without reads, see
  // GatherIoLocked).
  std::deque<int> write_queue_ GUARDED_BY(ctx_.mu);
  std::deque<int> home_write_queue_ GUARDED_BY(ctx_.mu);
  bool home_writes_held_ GUARDED_BY(ctx_.mu) = false;  // ReleaseHomeWritesLocked
  int writes_in_flight_ GUARDED_BY(ctx_.mu) = 0;
  std::thread io_thread_;
};

}  // namespace strata::engine_internal
