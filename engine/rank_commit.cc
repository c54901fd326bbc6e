#include "engine/rank_commit.h"

#include <algorithm>
#include <string>
#include <vector>

namespace strata::engine_internal {

namespace {

// One rank's resume point, gathered as bytes.
struct ResumePoint {
  uint32_t opened = 0;  // 0: the rank's store did not open
  uint32_t has_committed = 0, has_prepared = 0;
  uint32_t pad = 0;
  uint64_t committed = 0, prepared = 0;
};

Result<std::vector<ResumePoint>> GatherResumePoints(EngineContext& ctx, const ResumePoint& mine) {
  std::vector<ResumePoint> all(static_cast<size_t>(ctx.ws));
  CollectiveOptions co;
  co.label = "all-gather resume points";
  STRATA_RETURN_IF_ERROR(
      ctx.host_comm->AllGather(&mine, all.data(), sizeof mine, CommDataType::kByte, co)
          .Wait()
          .Annotate("agreeing with the other ranks on the step to resume"));
  return all;
}

std::string Describe(const ResumePoint& p) {
  if (!p.has_committed) return "no committed step";
  std::string s = "step " + std::to_string(p.committed);
  if (p.has_prepared) s += " (step " + std::to_string(p.prepared) + " prepared)";
  return s;
}

}  // namespace

Status CommitWithRanks(EngineContext& ctx, SwapStore& store, uint64_t step) {
  const Status prepared = store.PrepareCommit(step);
  const uint32_t mine = prepared.ok() ? 1 : 0;
  std::vector<uint32_t> all(static_cast<size_t>(ctx.ws), 0);
  CollectiveOptions co;
  co.label = "all-gather commit prepared";
  STRATA_RETURN_IF_ERROR(
      ctx.host_comm->AllGather(&mine, all.data(), sizeof mine, CommDataType::kByte, co)
          .Wait()
          .Annotate("agreeing with the other ranks that step " + std::to_string(step) +
                    " is prepared on every rank"));
  if (!prepared.ok()) return prepared;
  for (int r = 0; r < ctx.ws; ++r) {
    if (all[size_t(r)] == 0) {
      return Status::Aborted("rank " + std::to_string(r) +
                             " failed to prepare its commit of step " + std::to_string(step) +
                             " (its own message says why); no rank commits it, so every rank "
                             "still holds the previous commit");
    }
  }
  return store.FinishCommit();
}

Result<bool> AgreeOnResumedCommit(EngineContext& ctx, std::optional<uint64_t> committed,
                                  std::optional<uint64_t> prepared) {
  ResumePoint mine;
  mine.opened = 1;
  mine.has_committed = committed.has_value();
  mine.committed = committed.value_or(0);
  mine.has_prepared = prepared.has_value();
  mine.prepared = prepared.value_or(0);
  STRATA_ASSIGN_OR_RETURN(std::vector<ResumePoint> all, GatherResumePoints(ctx, mine));
  std::string table;
  for (int r = 0; r < ctx.ws; ++r) {
    table += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": " +
             (all[size_t(r)].opened ? Describe(all[size_t(r)]) : "its store did not open");
  }
  for (int r = 0; r < ctx.ws; ++r) {
    if (!all[size_t(r)].opened) {
      return Status::Aborted("rank " + std::to_string(r) +
                             " could not open its store to resume (its own message says why)");
    }
  }
  // The newest step any rank committed: every rank committed it or prepared it.
  std::optional<uint64_t> target;
  for (const ResumePoint& p : all) {
    if (p.has_committed) target = std::max(target.value_or(0), p.committed);
  }
  for (int r = 0; r < ctx.ws; ++r) {
    const ResumePoint& p = all[size_t(r)];
    const bool holds = target ? (p.has_committed && p.committed == *target) ||
                                    (p.has_prepared && p.prepared == *target)
                              : !p.has_committed;
    if (!holds) {
      return Status::Corruption(
          "the ranks' stores hold no common step to resume (" + table +
          "); a commit reaches every rank or none, so a store was changed or replaced from "
          "another run. Resume with every rank's folder of one run");
    }
  }
  return target && !(mine.has_committed && mine.committed == *target);
}

void ReportFailedResume(EngineContext& ctx) {
  ResumePoint mine;  // opened = 0
  (void)GatherResumePoints(ctx, mine);
}

}  // namespace strata::engine_internal
