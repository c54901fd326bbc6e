// strata::PeekCommittedStep and StoreStateFiles (strata/engine.h): what callers that must not
// open (lock) a store learn of it: its last committed step (the CLI's resume checks) and the
// files of its committed state (the Python layer's checkpoints); ComputeBlockLayout, the
// layout of what a store holds (strata export and verify).
#include "engine/plan.h"
#include "io/swap_store.h"
#include "strata/engine.h"

namespace strata {

Result<std::optional<uint64_t>> PeekCommittedStep(const std::string& folder) {
  return SwapStore::PeekCommittedStep(folder);
}

Result<StorePeek> PeekStore(const std::string& folder) {
  STRATA_ASSIGN_OR_RETURN(SwapStore::Peek p, SwapStore::PeekManifests(folder));
  return StorePeek{p.step, p.run_id, p.prepared_step, p.prepared_run_id};
}

std::vector<std::string> StoreStateFiles(size_t index, size_t folders) {
  return SwapStore::StateFileNames(index, folders);
}

Result<std::vector<BlockLayout>> ComputeBlockLayout(const std::vector<BlockSpec>& blocks,
                                                    uint32_t tensor_alignment, int world_size) {
  return engine_internal::ComputeLayout(blocks, tensor_alignment, world_size);
}

}  // namespace strata
