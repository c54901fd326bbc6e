// The ranks' stores commit together. Each rank keeps its own SwapStore (its shard of every
// block); a commit that reached some ranks' disks and not others' would leave no step every
// rank can resume (a rank killed between its commit and its peers'). So with several ranks a
// commit is two-phase: every rank prepares step k (data synced, manifest of k durable under a
// temporary name), the ranks agree that all prepared, then every rank finishes (renames it).
// A crash then leaves each store at k committed, or at k-1 committed with k prepared: if any
// rank committed k, every rank had prepared it, and resuming rolls the others forward to k;
// if none did, every rank resumes k-1 and the prepared manifests are discarded.
#pragma once

#include <optional>

#include "engine/engine_context.h"
#include "io/swap_store.h"

namespace strata::engine_internal {

// Commits `step` on every rank's store (each rank calls it at the same point). A rank whose
// prepare failed returns its error; the others return an error naming it, and no rank
// finishes the commit.
Status CommitWithRanks(EngineContext& ctx, SwapStore& store, uint64_t step);

// At resume, from SwapStoreOptions::resolve_prepared: this rank's committed and prepared
// steps against the other ranks'. Returns whether this rank rolls its prepared step forward,
// or an error naming the ranks when no step is held (or can be reached) by every rank.
Result<bool> AgreeOnResumedCommit(EngineContext& ctx, std::optional<uint64_t> committed,
                                  std::optional<uint64_t> prepared);

// At resume, when this rank's store failed to open before AgreeOnResumedCommit ran: tells the
// other ranks (waiting in it) that this rank has no step to resume, so that they fail at once
// naming it instead of waiting for the communication timeout.
void ReportFailedResume(EngineContext& ctx);

}  // namespace strata::engine_internal
