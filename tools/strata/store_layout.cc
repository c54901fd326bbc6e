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

Result<StoredLayout> FindStoredLayout(const std::function<std::string(int)>& folder0,
                                      const std::string& run_id) {
  STRATA_ASSIGN_OR_RETURN(const StorePeek p0, PeekStore(folder0(0)));
  const std::optional<int> n0 = RankCount(p0.run_id, run_id);
  // A store that names no rank count (made before identities) is resumed as it is.
  if (!n0 || !p0.step) return StoredLayout{0, p0.step.value_or(0)};
  StoredLayout layout{*n0, *p0.step};
  // Rank 0 prepared the re-sharding commit (the same step, the new count) and did not
  // finish it: the new layout holds when another rank of that count finished it.
  const std::optional<int> m = RankCount(p0.prepared_run_id, run_id);
  if (m && *m != *n0 && p0.prepared_step && *p0.prepared_step >= *p0.step) {
    for (int k = 1; k < *m; ++k) {
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
