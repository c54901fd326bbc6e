// strata::PeekCommittedStep (strata/engine.h): a store's last committed step for callers that
// must not open (lock) the store, such as the CLI's resume checks.
#include "io/swap_store.h"
#include "strata/engine.h"

namespace strata {

Result<std::optional<uint64_t>> PeekCommittedStep(const std::string& folder) {
  return SwapStore::PeekCommittedStep(folder);
}

}  // namespace strata
