#include "engine/stats_ledger.h"

#include <algorithm>
#include <utility>

namespace strata::engine_internal {

void StatsLedger::Apply(const DeferredCost& cost, double sign, StepStats* st) {
  double& optim = st->busy_seconds[int(Resource::kCpuOptim)];
  double& write = st->busy_seconds[int(Resource::kNvmeWrite)];
  optim = std::max(0.0, optim + sign * cost.optim_seconds);
  write = std::max(0.0, write + sign * cost.write_seconds);
  uint64_t& bytes = st->bytes.nvme_write;
  bytes = sign > 0 ? bytes + cost.write_bytes : bytes - std::min(bytes, cost.write_bytes);
  if (sign > 0) {
    st->overlapped_seconds = cost.overlapped_seconds;
    st->seconds += cost.serial_seconds;
    st->tail_seconds += cost.serial_seconds;
  } else {
    st->overlapped_seconds = 0;  // the previous step's: its own is set when it commits
  }
  // The bound anew over the moved busy times (nvme_busy_seconds stays the window's).
  st->bound_seconds = 0;
  st->bound_resource.clear();
  for (int r = 0; r < kNumResources; ++r) {
    if (st->busy_seconds[r] > st->bound_seconds) {
      st->bound_seconds = st->busy_seconds[r];
      st->bound_resource = ResourceName(Resource(r));
    }
  }
  if (st->nvme_busy_seconds > st->bound_seconds) {
    st->bound_seconds = st->nvme_busy_seconds;
    st->bound_resource = "nvme";
  }
  st->efficiency = st->seconds > 0 ? st->bound_seconds / st->seconds : 0;
}

void StatsLedger::EndStep(const StepStats& window, const std::optional<DeferredCost>& carried,
                          bool deferred) {
  StepStats own = window;
  if (carried) {
    Apply(*carried, -1, &own);
    if (pending_) {
      Apply(*carried, +1, &*pending_);
      final_.push_back(std::move(*pending_));
      pending_.reset();
    }
  }
  // Defensive: a pending step is completed by Carried or Drained before the next EndStep.
  if (pending_) {
    final_.push_back(std::move(*pending_));
    pending_.reset();
  }
  if (deferred) {
    pending_ = std::move(own);
  } else {
    final_.push_back(std::move(own));
  }
}

void StatsLedger::Drained(const DeferredCost& cost) {
  if (!pending_) return;
  Apply(cost, +1, &*pending_);
  final_.push_back(std::move(*pending_));
  pending_.reset();
}

std::vector<StepStats> StatsLedger::Take() { return std::exchange(final_, {}); }

}  // namespace strata::engine_internal
