// ActivationStash: the activations a model keeps in the engine within a step
// (Engine::StashActivation / FetchActivation; docs/design.md "Activations"): the inputs of
// blocks it recomputes in backward, and in layer-major order the inputs of micro-batches
// waiting for the next block. A fourth kind of state beside parameters, optimizer states and
// gradients, with its own home tiers and none of their commits.
//
// Tiers. `activation_host_slots` pinned host slots (PlacementReport; allocated from the
// engine's pinned pool, so registered with the device like the rest) of activation_bytes
// rounded to 4 KiB, and, when the host budget leaves fewer slots than activation_count, one
// scratch file per NVMe folder ("strata.activations.rank<r>.<i>-of-<n>": a rank's own name,
// beside the swap store's files), each key taking one NVMe slot (striped over the folders)
// from its first spill to its drop. The files are made and allocated in full at Init, locked
// (flock) against another engine, opened through the engine's IoBackend kind
// (EngineOptions::io_backend_factory) with O_DIRECT, and removed at close. Nothing is
// committed: a crash loses only activations, which no resume needs; the file it leaves is
// taken over by the next engine of that rank in that folder, or removed at its Init when that
// engine does not use it (RemoveLeftoverScratchFiles).
//
// Lifecycle of a key: Stash lands it in a free host slot (D2H on Lane::kD2H, after the
// compute work that wrote it). When more keys are live than the host slots can hold beside a
// free landing slot, the I/O thread spills one (writes it with an XXH3 checksum kept in
// memory, then frees its slot; the NVMe copy stays valid while the key lives, so a later
// eviction of the same key costs nothing). Fetch copies it to the device from its host slot
// (H2D on Lane::kH2D, compute waits for it by an event); a key that is only on NVMe is read
// back first (the caller blocks), its checksum verified. `last` drops the key.
//
// Prefetch: the first step's sequence of Stash/Fetch calls (keys, order, last flags) is
// learned. In a later step, while its calls match the learned sequence, the victim of a spill
// is the host-resident key fetched farthest ahead (Belady) and keys on NVMe are read back
// into free slots in the order of their next fetch (a key fetched sooner displaces one
// fetched later). A step that departs from the sequence runs without prefetch (the oldest
// key is spilled first, which is Belady's choice for backward's reverse order) and is
// learned in its place. Only timing depends on this, never a byte delivered.
//
// Threads: Stash/Fetch/BeginStep/EndStep on the model's thread; one I/O thread of the stash's
// own (only when it spills), the only user of its IoBackend. Its own mutex (never held while
// taking EngineContext::mu; taken under it by StatsLocked), its own condition variable.
// Why its own thread, not HostTier's: the host tier's thread runs a plan fixed at BeginStep
// in order, while activations come when the model sends them; a spill queued behind the
// plan's loads would stall the model's next Stash.
//
// Failures: a failed device copy, an NVMe error (IOError naming the file and offset) or a
// checksum mismatch (Corruption naming the key, file and offset) is stored here and in the
// engine (EngineContext::SetWorkerError), returned by the Fetch (or Stash) waiting and by
// EndStep; the engine then refuses further steps. Never wrong bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine_context.h"
#include "engine/host_tier.h"
#include "strata/io.h"

namespace strata::engine_internal {

class ActivationStash {
 public:
  ActivationStash(EngineContext& ctx, HostTier& host) : ctx_(ctx), host_(host) {}
  ~ActivationStash();  // Shutdown, then closes and removes the scratch files
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;

  // Init, after the pinned pool exists and before any step: the host slots, the scratch
  // files (OutOfMemory/NoSpace naming the folder and bytes when a disk cannot hold them) and
  // the I/O thread. Nothing without activations.
  Status Init() EXCLUDES(mu_);
  // Stops the I/O thread after the transfer in flight (before the pool is freed).
  void Shutdown() EXCLUDES(mu_);

  // Engine::StashActivation / FetchActivation (see strata/engine.h).
  Result<EventPtr> Stash(uint32_t key, const void* device_src, uint64_t bytes) EXCLUDES(mu_);
  Status Fetch(uint32_t key, void* device_dst, bool last) EXCLUDES(mu_);

  void BeginStep() EXCLUDES(mu_);
  // Waits for the transfer in flight, drops every live activation and learns the step's
  // sequence (when it departed from the learned one). Returns the step's stored error.
  // OK when no step is open here.
  Status EndStep() EXCLUDES(mu_);
  // The step's activation_bytes, activation_fetch_waits; the host slots into peak_host_bytes.
  void AddStats(StepStats* st) const EXCLUDES(mu_);

 private:
  // One call of the step, as learned.
  struct Op {
    bool fetch = false;
    uint32_t key = 0;
    bool last = false;
    bool operator==(const Op&) const = default;
  };
  // One live activation.
  struct Act {
    uint64_t bytes = 0;
    uint64_t seq = 0;         // stash order: without a learned sequence the oldest spills first
    int slot = -1;            // host slot holding (or receiving) its bytes; -1: none
    bool host_ready = false;  // the slot holds them (landing enqueued, or read back)
    EventPtr landed;          // the D2H landing, until a write or read synchronised it
    int nvme = -1;            // NVMe slot of its spilled copy (valid while live), or -1
    uint64_t checksum = 0;    // XXH3 of its bytes, with nvme >= 0
    bool writing = false, reading = false;
    bool dead = false;  // fetched for the last time while writing: dropped when that ends
  };
  // A transfer of the I/O thread.
  struct Job {
    bool write = false;
    uint32_t key = 0;
    int slot = -1, nvme = -1;
    uint64_t bytes = 0;     // the activation's bytes (the transfer is rounded to 4 KiB)
    uint64_t checksum = 0;  // read: expected; write: computed
    EventPtr wait;          // device work to finish first (write: the landing; read: the slot's)
  };

  Status OpenScratchFiles() EXCLUDES(mu_);
  // Removes this rank's scratch files that no engine holds (left by a killed run).
  void RemoveLeftoverScratchFiles() const;
  // PlacementReport::activation_nvme_capacity: from the folders' free space and the files.
  Result<int64_t> NvmeCapacity() const EXCLUDES(mu_);
  void IoLoop() EXCLUDES(mu_);
  // The next transfer to run, choosing it as the header comment says; drops clean host
  // copies on the way. nullopt: nothing to do now.
  std::optional<Job> PickJobLocked() REQUIRES(mu_);
  Status RunJob(Job* job) EXCLUDES(mu_);
  void FinishJobLocked(const Job& job, Status s) REQUIRES(mu_);
  // A victim (next fetch farther than `sooner`, or any with -1) spilled or, when its NVMe
  // copy is valid, dropped from host memory: returns a write, or nullopt with *dropped set
  // when one was dropped.
  std::optional<Job> EvictLocked(int64_t sooner, bool* dropped) REQUIRES(mu_);
  Job ReadJobLocked(uint32_t key, Act& a) REQUIRES(mu_);
  // Free slots kept for the next Stash's landing.
  int ReserveLocked() const REQUIRES(mu_);
  // Position of the next fetch of `key` in the learned sequence (from the cursor), or
  // INT64_MAX; only meaningful while on track.
  int64_t NextUseLocked(uint32_t key) const REQUIRES(mu_);
  void TrackLocked(const Op& op) REQUIRES(mu_);
  void DropLocked(uint32_t key) REQUIRES(mu_);
  // Stores the first failure here (waking waiters); the caller then reports it to the engine.
  void FailLocked(const Status& s) REQUIRES(mu_);
  // File and offset of NVMe slot `nvme`.
  std::pair<int, uint64_t> Where(int nvme) const {
    const int f = nvme % int(files_.size());
    return {f, uint64_t(nvme / int(files_.size())) * slot_bytes_};
  }

  EngineContext& ctx_;
  HostTier& host_;
  // Fixed at Init.
  int count_ = 0;                // activation_count (0: no stash)
  uint64_t max_bytes_ = 0;       // activation_bytes
  uint64_t slot_bytes_ = 0;      // rounded to 4 KiB
  bool spill_ = false;           // fewer host slots than activations: NVMe in use
  std::vector<char*> slot_buf_;  // pinned host slots
  struct ScratchFile {
    std::string path;
    int lock_fd = -1;  // flock held while the engine lives
    int file = -1;     // the backend's handle
  };
  std::vector<ScratchFile> files_;
  std::unique_ptr<IoBackend> backend_;  // the I/O thread's only
  // STRATA_TEST_KILL_AT (engine/fault_env.h) at "activation_write_submitted" (a spill in
  // flight) and "activation_read_submitted" (a read back in flight); the I/O thread's only.
  std::function<void(std::string_view)> kill_hook_;
  std::thread io_thread_;

  mutable Mutex mu_;
  CondVar cv_{&mu_};
  Status error_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
  bool step_open_ GUARDED_BY(mu_) = false;
  bool io_busy_ GUARDED_BY(mu_) = false;  // a job between PickJobLocked and FinishJobLocked
  std::unordered_map<uint32_t, Act> live_ GUARDED_BY(mu_);
  std::vector<int> free_slots_ GUARDED_BY(mu_);
  std::vector<EventPtr> slot_busy_ GUARDED_BY(mu_);  // per slot: its last device copy
  std::vector<int> free_nvme_ GUARDED_BY(mu_);
  std::optional<uint32_t> wanted_ GUARDED_BY(mu_);  // a Fetch waiting for its read
  bool landing_wanted_ GUARDED_BY(mu_) = false;     // a Stash waiting for a free slot
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  // The learned sequence and, per key, the positions of its fetches in it.
  std::vector<Op> learned_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, std::vector<int64_t>> fetch_pos_ GUARDED_BY(mu_);
  int64_t last_stash_pos_ GUARDED_BY(mu_) = -1;
  std::vector<Op> record_ GUARDED_BY(mu_);  // this step's calls
  bool on_track_ GUARDED_BY(mu_) = false;   // every call so far matched learned_
  int64_t cursor_ GUARDED_BY(mu_) = 0;      // calls matched
  EdgeBytes step_bytes_ GUARDED_BY(mu_);
  int64_t fetch_waits_ GUARDED_BY(mu_) = 0;
};

}  // namespace strata::engine_internal
