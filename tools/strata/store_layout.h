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

#include "strata/comm.h"
#include "strata/status.h"

namespace strata::cli {

struct StoredLayout {
  int world_size = 0;  // the ranks whose stores hold the state to resume; 0: not recorded
  uint64_t step = 0;   // its step
};

// Rank q of the stored run, as rank `now` of this run fills in a folder template ({rank},
// {local_rank}; RankPath): `now` itself for q == now.rank (its own folder), else rank q on
// one host (local rank q: where the old ranks were is not recorded, and a re-sharding reads
// every old rank's store, so they are all on this host's file systems). The one way both the
// resume's checks and the re-sharding's reads name an old rank's folder.
RankInfo StoredRank(const RankInfo& now, int q);

// `folder0(q)`: the first folder of rank q's store. Rank `self`'s store is read first (on
// several hosts, another rank's folder may be on another host); a re-sharding commit it
// prepared and did not finish is looked for among the other ranks' stores that can be read
// here. The peek's error when `self`'s store cannot be read.
Result<StoredLayout> FindStoredLayout(const std::function<std::string(int)>& folder0, int self,
                                      const std::string& run_id);

// The identity rank `rank`'s store recorded under another rank count when a prepared commit
// there records `run_id_now` (a re-sharding's first commit to be rolled forward); "" else.
std::string PreviousStoreRunId(const std::string& folder0, const std::string& run_id_now);

}  // namespace strata::cli
