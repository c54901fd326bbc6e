// Residency: the one state machine that says where a copy of a component is and what may
// be done with it. Every cached copy — a block's params in device memory, a component's
// host copy in the pinned pool — carries one Residency, and every change goes through
// Residency::To(), which refuses transitions the machine does not have: a refusal is an
// internal error (a bug in the engine), returned as an Aborted status that the caller
// annotates with the copy's name and surfaces as the engine's error, never dropped.
//
//                      load submitted           load done
//        +--------> kAbsent ----------> kLoading ----------> kReady <------------------+
//        |            |  allocate for a use that writes        |  ^                    |
//        |            +----------------------------------------+  | last user done,    |
//        | evict (no  |                                           |  content unchanged  |
//        | user, not  |                      first user starts    |                     |
//        | dirty)     |                    (copy, D2H, optimizer) v                     |
//        +--------- kReady                                     kInUse <-------------+  |
//                                                                 | last user done   |  |
//                                                                 v and changed      |  |
//                                                               kDirty --> kWriting -+--+
//                                                           write submitted   write done (kInUse
//                                                                             while readers share
//                                                                             it)
//
// Lifecycle per tier:
//  - device (params): kAbsent -> kLoading (H2D copy enqueued) -> kReady (copy's event
//    recorded; later device work orders itself after it) -> kInUse (Acquire .. Release)
//    -> kReady -> kAbsent when the plan evicts it (after the compute that used it has
//    finished) or at the end of the step (an update makes it stale). Device copies are
//    never dirty: gradients travel in separate buffers.
//  - host (master, moments, param copy, gradient): kAbsent -> kLoading (NVMe read in
//    flight; or zero-fill for a component never written) -> kReady; users are H2D copies
//    (read), gradient landings (write) and the optimizer (read-modify-write); after an
//    update an NVMe-homed (or durable) component is kDirty until its write to a fresh
//    extent completes. Host-homed components start kReady and are never evicted.
//  - a write only reads the copy, so readers (the feeder's H2D copies, HostTier::
//    ReadableLocked) may share it: they enter and leave a kWriting copy without changing its
//    state, and the write's completion leaves it kInUse while they are still there
//    (WriteDone); a reader of a kDirty copy (its write not yet submitted) leaves it kDirty
//    (Enter's rule), so the write follows. A user that modifies it, an eviction and an
//    allocation over it wait for kReady: a buffer still being written is never evicted or
//    overwritten.
//
// Error handling: a failed load or write leaves the copy in kLoading/kWriting for good; the
// engine stores the error and every waiter on that copy returns it. Partial I/O never shows
// here: the SwapStore reports a transfer only when all of it moved.
//
// Gradient buffers in device memory use the same machine: allocated -> kReady; SubmitGrads
// hands the buffer to the lander (kInUse) until the D2H copy out of it is enqueued (kReady
// again), so "kReady and no later access" is when the feeder may free any device buffer.
//
// Concurrency: a Residency is plain data guarded by the engine's mutex (EngineContext::mu);
// waiters use the engine's condition variable.
#pragma once

#include <cstdint>
#include <string>

#include "strata/status.h"

namespace strata::engine_internal {

enum class ResidencyState : uint8_t { kAbsent, kLoading, kReady, kInUse, kDirty, kWriting };

inline const char* ResidencyStateName(ResidencyState s) {
  switch (s) {
    case ResidencyState::kAbsent:
      return "absent";
    case ResidencyState::kLoading:
      return "loading";
    case ResidencyState::kReady:
      return "ready";
    case ResidencyState::kInUse:
      return "in_use";
    case ResidencyState::kDirty:
      return "dirty";
    case ResidencyState::kWriting:
      return "writing";
  }
  return "?";
}

struct Residency {
  ResidencyState state = ResidencyState::kAbsent;
  int users = 0;  // operations using the copy now (kInUse while > 0)

  static bool Allowed(ResidencyState from, ResidencyState to) {
    using S = ResidencyState;
    switch (from) {
      case S::kAbsent:
        return to == S::kLoading || to == S::kReady;  // kReady: allocated for a writing use
      case S::kLoading:
        return to == S::kReady;
      case S::kReady:
        return to == S::kInUse || to == S::kAbsent;
      case S::kInUse:
        return to == S::kReady || to == S::kDirty || to == S::kInUse;
      case S::kDirty:
        return to == S::kWriting || to == S::kInUse;
      case S::kWriting:
        return to == S::kReady || to == S::kInUse;  // kInUse: readers still in it
    }
    return false;
  }

  // Changes nothing and returns Aborted for a transition the machine does not have.
  [[nodiscard]] Status To(ResidencyState to) {
    if (!Allowed(state, to)) return Refused(to);
    state = to;
    return Status::OK();
  }

  // A user starts: kReady/kDirty/kInUse -> kInUse. A copy entered while kDirty (its write
  // not yet submitted) is dirty again when its users are done, whatever they did. A reader
  // may enter a kWriting copy: it stays kWriting (see WriteDone).
  [[nodiscard]] Status Enter() {
    if (state == ResidencyState::kWriting) {
      ++users;
      return Status::OK();
    }
    const bool was_dirty = state == ResidencyState::kDirty;
    if (state != ResidencyState::kInUse) STRATA_RETURN_IF_ERROR(To(ResidencyState::kInUse));
    dirty_pending |= was_dirty;
    ++users;
    return Status::OK();
  }
  // A user ends; `modified` marks the content changed (it must reach NVMe before eviction
  // when `needs_write`).
  [[nodiscard]] Status Leave(bool modified, bool needs_write) {
    if (state == ResidencyState::kWriting && users > 0) {
      // A reader of a copy being written: it must not have changed what the write reads.
      if (modified) {
        return Status::Aborted("internal: residency: a user modified a copy being written");
      }
      --users;
      return Status::OK();
    }
    if (state != ResidencyState::kInUse || users <= 0) {
      return Status::Aborted(std::string("internal: residency: a user leaves a copy in state ") +
                             ResidencyStateName(state) + " with " + std::to_string(users) +
                             " users");
    }
    dirty_pending |= modified && needs_write;
    if (--users > 0) return Status::OK();
    const bool d = dirty_pending;
    dirty_pending = false;
    return To(d ? ResidencyState::kDirty : ResidencyState::kReady);
  }
  // The write of a kWriting copy completed: kReady, or kInUse while readers that entered
  // during the write are still there.
  [[nodiscard]] Status WriteDone() {
    if (state != ResidencyState::kWriting) return Refused(ResidencyState::kReady);
    return To(users > 0 ? ResidencyState::kInUse : ResidencyState::kReady);
  }
  bool dirty_pending = false;

 private:
  Status Refused(ResidencyState to) const {
    return Status::Aborted(std::string("internal: residency transition ") +
                           ResidencyStateName(state) + " -> " + ResidencyStateName(to) +
                           " refused");
  }
};

}  // namespace strata::engine_internal
