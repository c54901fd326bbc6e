// StatsLedger: each step's statistics made final when the step commits
// (Engine::TakeCommittedStats). EndStep's figures are taken over the step's window (BeginStep
// to the end of EndStep). With pipelined updates (docs/design.md "Pipelined step boundary")
// that window holds the previous step's deferred updates, writes and commit, and not the
// step's own, which run under the next step or between steps. The ledger moves that work to
// the step it belongs to: a step's final figures count its own deferred updates and not the
// previous step's.
//
// Plain data, no engine state: the step coordinator (engine.cc) tells it what each step's
// window held and what each step's deferred work cost, under its lock.
#pragma once

#include <optional>
#include <vector>

#include "strata/engine.h"

namespace strata::engine_internal {

// What a step's deferred updates cost where they ran.
struct DeferredCost {
  double optim_seconds = 0;  // the updates (cpu_optim busy)
  double write_seconds = 0;  // their NVMe writes and the commit (nvme_write busy)
  uint64_t write_bytes = 0;  // their NVMe writes
  // Under the next step: from its BeginStep to the commit (StepStats::overlapped_seconds).
  double overlapped_seconds = 0;
  // Between steps (Flush, a read, a BeginStep that could not carry them): the time they
  // took, a serial tail of the step (added to its seconds and tail_seconds).
  double serial_seconds = 0;
};

class StatsLedger {
 public:
  // EndStep of a step with window figures `window`. `carried`: the previous step's
  // deferred work that ran inside the window and committed (nullopt when nothing was
  // carried). `deferred`: the step left updates to the next one, so it is final only
  // once they ran (Carried at the next EndStep, or Drained).
  void EndStep(const StepStats& window, const std::optional<DeferredCost>& carried, bool deferred);
  // The pending step's deferred updates ran between steps and it committed.
  void Drained(const DeferredCost& cost);
  // The final statistics of the steps committed since the last call, in step order.
  std::vector<StepStats> Take();

 private:
  // `st` with `cost` added (sign +1) or taken out (-1), its bound and efficiency anew.
  static void Apply(const DeferredCost& cost, double sign, StepStats* st);

  std::optional<StepStats> pending_;  // a step whose commit waits for its deferred updates
  std::vector<StepStats> final_;      // committed, not yet taken
};

}  // namespace strata::engine_internal
