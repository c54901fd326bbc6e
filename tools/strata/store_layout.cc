// FindStoredLayout (tools/strata/store_layout.h).
#include "tools/strata/store_layout.h"

#include <optional>

#include "strata/engine.h"

namespace strata::cli {
namespace {

// N in "<run> rank R of N" of run `run_id`; nullopt for another run or form.
std::optional<int> RankCount(const std::string& store_run_id, const std::string& run_id) {
  if (store_run_id.rfind(run_id + " rank ", 0) != 0) return std::nullopt;
  const size_t of = store_run_id.rfind(" of ");
  if (of == std::string::npos) return std::nullopt;
  try {
    const int n = std::stoi(store_run_id.substr(of + 4));
    return n >= 1 ? std::optional<int>(n) : std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

RankInfo StoredRank(const RankInfo& now, int q) {
  if (q == now.rank) return now;
  RankInfo old = now;
  old.rank = q;
  old.local_rank = q;
  return old;
}

Result<StoredLayout> FindStoredLayout(const std::function<std::string(int)>& folder0, int self,
                                      const std::string& run_id) {
  STRATA_ASSIGN_OR_RETURN(const StorePeek p0, PeekStore(folder0(self)));
  const std::optional<int> n0 = RankCount(p0.run_id, run_id);
  if (!n0 && !p0.run_id.empty() && p0.run_id != run_id) {
    // Named here, before the ranks compare what each read (the engine would refuse it too).
    const std::string manifest = folder0(self) + "/strata.manifest";
    return Status::InvalidArgument(
               "the swap store in " + folder0(self) + " belongs to another run: its manifest " +
               manifest + " names run '" + p0.run_id + "', the record there run '" + run_id +
               "' (the manifest and data files were copied from another run "
               "or rank?); resume the folder this run wrote")
        .WithPath(manifest);
  }
  // A store that names no rank count (made before identities) is resumed as it is.
  if (!n0 || !p0.step) return StoredLayout{0, p0.step.value_or(0)};
  StoredLayout layout{*n0, *p0.step};
  // This rank prepared the re-sharding commit (the same step, the new count) and did not
  // finish it: the new layout holds when another rank of that count finished it.
  const std::optional<int> m = RankCount(p0.prepared_run_id, run_id);
  if (m && *m != *n0 && p0.prepared_step && *p0.prepared_step >= *p0.step) {
    for (int k = 0; k < *m; ++k) {
      if (k == self) continue;
      Result<StorePeek> pk = PeekStore(folder0(k));
      if (pk.ok() && pk->step == p0.prepared_step && RankCount(pk->run_id, run_id) == m) {
        return StoredLayout{*m, *p0.prepared_step};
      }
    }
  }
  return layout;
}

std::string PreviousStoreRunId(const std::string& folder0, const std::string& run_id_now) {
  Result<StorePeek> p = PeekStore(folder0);
  if (!p.ok() || p->run_id == run_id_now || p->prepared_run_id != run_id_now) return "";
  return p->run_id;
}

}  // namespace strata::cli
