// The trainer's multi-rank protocols; see messages.h.
#include "comm/messages.h"

#include <cstring>

#include "comm/rank_groups.h"

namespace strata {

Status AgreeOnResumedStep(Communicator& comm, int64_t step) {
  struct ResumedStep {
    int64_t step;
  };
  STRATA_ASSIGN_OR_RETURN(std::vector<ResumedStep> all,
                          AllGatherMessages(comm, ResumedStep{step}, "all-gather resumed step"));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].step != step) {
      return Status::InvalidArgument("rank " + std::to_string(r) + " resumes step " +
                                     std::to_string(all[r].step) + " but this rank step " +
                                     std::to_string(step) +
                                     "; resume every rank from the same run (same world size)");
    }
  }
  return Status::OK();
}

Status CheckSameOnEveryRank(Communicator& comm, const std::vector<NamedValue>& mine,
                            std::string_view what) {
  // One fixed-size cell per option: the value's first characters and the FNV-1a hash of all
  // of it (what is compared).
  struct Cell {
    char text[56];
    uint64_t hash;
  };
  const uint64_t count = mine.size();
  STRATA_ASSIGN_OR_RETURN(std::vector<uint64_t> counts,
                          AllGatherMessages(comm, count, "all-gather option count"));
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] != count) {
      return Status::InvalidArgument("the ranks' " + std::string(what) + " differ: rank " +
                                     std::to_string(r) + " has " + std::to_string(counts[r]) +
                                     " options but this rank " + std::to_string(count) +
                                     "; run the same build of strata on every rank");
    }
  }
  if (count == 0) return Status::OK();
  std::vector<Cell> cells(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string& v = mine[i].value;
    std::memset(cells[i].text, 0, sizeof cells[i].text);
    if (v.size() < sizeof cells[i].text) {
      std::memcpy(cells[i].text, v.data(), v.size());
    } else {
      std::memcpy(cells[i].text, v.data(), sizeof cells[i].text - 4);
      std::memcpy(cells[i].text + sizeof cells[i].text - 4, "...", 3);
    }
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : v) h = (h ^ c) * 1099511628211ull;
    cells[i].hash = h;
  }
  const int n = comm.world_size();
  std::vector<Cell> all(count * size_t(n));
  CollectiveOptions co;
  co.label = "all-gather options";
  STRATA_RETURN_IF_ERROR(
      comm.AllGather(cells.data(), all.data(), count * sizeof(Cell), CommDataType::kByte, co)
          .Wait());
  std::string diff;
  for (size_t i = 0; i < count; ++i) {
    const auto cell = [&](int r) -> const Cell& { return all[size_t(r) * count + i]; };
    const std::string d = DescribeRankDifference(
        mine[i].name, n, [&](int r) { return cell(r).hash; },
        [&](int r) {
          const std::string text(cell(r).text, strnlen(cell(r).text, sizeof(Cell::text)));
          return text.empty() ? std::string("(none)") : text;
        });
    if (!d.empty()) diff += (diff.empty() ? "" : "; ") + d;
  }
  if (diff.empty()) return Status::OK();
  return Status::InvalidArgument("the ranks' " + std::string(what) + " differ: " + diff +
                                 "; start every rank with the same options (they fix the "
                                 "order of the collectives and the numbers)");
}

}  // namespace strata
