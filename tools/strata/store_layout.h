// Which rank count holds a run's committed state: what `strata train --resume` on any
// number of ranks reads before it opens a store (nothing is locked, made or changed).
//
// Each rank's store records "<run> rank R of N" (StoreRunId). A resume on another number of
// ranks re-shards (EngineOptions::reshard_from) and commits the new count at the same step,
// two-phase: when that was cut short between its phases, the new layout holds only if a rank
// finished it (a commit reaches every rank or none; engine/rank_commit.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "strata/status.h"

namespace strata::cli {

struct StoredLayout {
  int world_size = 0;  // the ranks whose stores hold the state to resume; 0: not recorded
  uint64_t step = 0;   // its step
};

// `folder0(q)`: the first folder of rank q's store. The peek's error when rank 0's store
// cannot be read.
Result<StoredLayout> FindStoredLayout(const std::function<std::string(int)>& folder0,
                                      const std::string& run_id);

// The identity rank `rank`'s store recorded under another rank count when a prepared commit
// there records `run_id_now` (a re-sharding's first commit to be rolled forward); "" else.
std::string PreviousStoreRunId(const std::string& folder0, const std::string& run_id_now);

}  // namespace strata::cli
