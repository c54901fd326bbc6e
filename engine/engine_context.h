// EngineContext: what every part of the engine shares — the configuration fixed at Init,
// the open step's plan, and the one mutex, condition variable and error of the engine.
//
// The engine is split by state (LevelDB's DBImpl/VersionSet split is the model):
//   engine.cc           the step coordinator: the model's calls (BeginStep .. EndStep) and
//                       the parameters between steps;
//   host_tier.h         NVMe <-> pinned: the host copies, the cache, the SwapStore, the
//                       host plan's execution and the write queue (the I/O thread);
//   device_tier.h       pinned <-> device: the device buffers (the feeder and the lander);
//   optimizer_stage.h   the gradient norm, clipping and AdamW (the optimizer thread);
//   collectives.h       the ranks' collectives behind one interface (none, host memory,
//                       device memory; the comm and watcher threads);
//   activation_stash.h  the activations the model stashes within a step (host slots, NVMe
//                       scratch files, prefetch; its own lock and I/O thread).
// Each part owns its fields; they all share EngineContext::mu (as LevelDB's VersionSet
// shares DBImpl's mutex): a step's threads wait on each other's state (a gather waits for a
// host copy, the optimizer for a landing and a norm), and one mutex with one condition
// variable keeps every such wait a plain predicate with no lock order to get wrong.
// Fields marked GUARDED_BY(ctx.mu) need it; methods named *Locked REQUIRE it.
//
// The plan of the open step (hplan, args, step) is written only by BeginStep, while no
// step is open and every worker waits for the next generation; the workers read it
// without the lock during the step (they see it through the mutex that published
// `generation`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/plan.h"
#include "engine/thread_annotations.h"
#include "engine/trace.h"
#include "strata/comm.h"
#include "strata/engine.h"
#include "strata/optim.h"

namespace strata::engine_internal {

// The arguments of one block's AdamW step: the step's learning rate, its number (bias
// correction, the moments' rounding key; with StepArgs::step_offset), the gradient's scale
// (grad_scale, times the clip coefficient once the norm is known) and the step's optimizer
// groups (StepArgs::groups; null when it has none), shared with the updates that run late.
struct UpdateArgs {
  double lr = 0;
  int64_t step = 0;
  float scale = 1;
  std::shared_ptr<const std::vector<OptimizerGroup>> groups;
};

struct EngineContext {
  EngineContext(const EngineOptions& options, std::vector<BlockLayout> block_layout)
      : opt(options),
        dev(options.device),
        comm(options.comm),
        host_comm(options.host_comm ? options.host_comm : options.comm),
        ws(options.comm ? options.comm->world_size() : 1),
        rank(options.comm ? options.comm->rank() : 0),
        layout(std::move(block_layout)),
        L(int(layout.size())) {}

  // ---- Fixed at construction or Init (before any thread starts). ----
  const EngineOptions opt;
  Device* const dev;
  Communicator* const comm;       // nullptr: one rank, no collectives
  Communicator* const host_comm;  // host-memory collectives (norm, ReadParams); or comm
  const int ws, rank;
  const std::vector<BlockLayout> layout;
  const int L;
  WorkingDtype dtype = WorkingDtype::kFp32;
  bool separate = false;  // a separate working-dtype param copy (kParam) exists
  bool durable = false;
  PlacementPlan place;
  std::vector<Access> schedule;
  DevicePlan dplan;
  std::vector<uint64_t> param_bytes, grad_bytes;  // full-block device bytes per block
  CpuKernelOptions kernel_options;
  int64_t resumed_step = 0;

  // ---- Thread-safe on their own. ----
  Timeline timeline;  // also counts the step's bytes per edge

  // ---- The open step's plan (see the header comment). ----
  HostPlan hplan;
  StepArgs args;
  std::shared_ptr<const std::vector<OptimizerGroup>> groups;  // args.groups; null when empty
  bool speculative = false;  // with clipping: restorable blocks update before the norm
  int64_t step = 0;          // steps begun by this engine
  // The previous step's updates that this one runs first (HostPlanInput::carried), with their
  // arguments; the previous step commits once they are written.
  std::vector<int> carried;
  UpdateArgs carried_args;

  // ---- The shared lock. ----
  mutable Mutex mu;
  CondVar cv{&mu};
  Status error GUARDED_BY(mu);
  bool shutdown GUARDED_BY(mu) = false;
  bool step_open GUARDED_BY(mu) = false;
  uint64_t generation GUARDED_BY(mu) = 0;  // bumps at each BeginStep

  std::string Key(int obj) const {
    std::string key = "b";  // (appended, not "b" + ...: GCC 12 warns -Wrestrict on that)
    key += std::to_string(ObjBlock(obj));
    key += '.';
    key += ComponentName(ObjComponent(obj));
    return key;
  }
  std::string ObjName(int obj) const {
    return "block '" + layout[ObjBlock(obj)].name + "' " + ComponentName(ObjComponent(obj));
  }
  // The part of [begin, end) (full-block elements) inside this rank's shard, as shard-local
  // [lo, hi); lo == hi when they do not meet.
  std::pair<uint64_t, uint64_t> ShardPart(int block, uint64_t begin, uint64_t end) const {
    const uint64_t s0 = uint64_t(rank) * layout[block].shard_numel;
    const uint64_t s1 = s0 + layout[block].shard_numel;
    const uint64_t lo = std::max(begin, s0), hi = std::min(end, s1);
    return lo < hi ? std::make_pair(lo - s0, hi - s0) : std::make_pair(uint64_t(0), uint64_t(0));
  }

  // Stores the first failure and wakes every waiter.
  void SetErrorLocked(Status s) REQUIRES(mu) {
    if (error.ok() && !s.ok()) error = std::move(s);
    cv.SignalAll();
  }
  void SetError(Status s) EXCLUDES(mu) {
    MutexLock lock(&mu);
    SetErrorLocked(std::move(s));
  }
  // A worker's failure: an Aborted after another failure is only that failure's echo (a
  // broken communicator, a shutdown), so it does not replace it.
  void SetWorkerError(Status s) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (!s.ok() && (s.code() != StatusCode::kAborted || error.ok())) SetErrorLocked(std::move(s));
  }
  Status Error() const EXCLUDES(mu) {
    MutexLock lock(&mu);
    return error;
  }
  void NotifyLocked() REQUIRES(mu) { cv.SignalAll(); }
  // Waits until pred() or an error or shutdown; returns the error (Aborted at shutdown).
  template <typename Pred>
  Status WaitLocked(Pred pred) REQUIRES(mu) {
    while (error.ok() && !shutdown && !pred()) cv.Wait();
    if (!error.ok()) return error;
    if (shutdown) return Status::Aborted("engine is shutting down");
    return Status::OK();
  }

  // The loop of a step worker: each step, wait for BeginStep, then run item(0), item(1), ...
  // up to count() (read when the step is picked up: after its last item the worker must not
  // read the plan, which the next BeginStep may be writing). The first failure is stored and
  // ends this worker's step.
  void RunStepWorker(const std::function<size_t()>& count,
                     const std::function<Status(size_t)>& item) EXCLUDES(mu) {
    uint64_t seen = 0;
    for (;;) {
      size_t n;
      {
        MutexLock lock(&mu);
        while (!shutdown && !(step_open && generation != seen)) cv.Wait();
        if (shutdown) return;
        seen = generation;
        n = count();
      }
      for (size_t i = 0; i < n; ++i) {
        Status s = item(i);
        if (!s.ok()) {
          SetWorkerError(std::move(s));
          break;
        }
      }
    }
  }
};

}  // namespace strata::engine_internal
