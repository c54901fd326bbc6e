// Checking and resolving EngineOptions before an engine exists: pure functions over the
// options (no state), called by Engine::Create and EngineImpl::Init (engine/engine.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "strata/engine.h"
#include "strata/status.h"

namespace strata::engine_internal {

// The optimizer's hyper-parameters are in range: grad_clip >= 0 and finite, betas in [0, 1),
// eps and weight_decay >= 0; and activation_count >= 0. InvalidArgument naming them otherwise.
Status CheckOptimizerOptions(const EngineOptions& opt);

// BeginStep's arguments are in range: lr >= 0, grad_scale > 0, every group's settings as
// CheckOptimizerOptions's, every tensor's group an index of args.groups (when it has any), and
// the step count of the bias correction (`steps_done` + 1 + step_offset) >= 1 and, with an
// NVMe store that has committed step `committed`, above it (the store's commits, which count
// steps as the bias correction does, only go forward). InvalidArgument naming the value (and the
// tensor) otherwise.
Status CheckStepArgs(const StepArgs& args, const std::vector<BlockLayout>& layout,
                     int64_t steps_done, std::optional<uint64_t> committed);

// The options with the ranks resolved from the communicator (world_size, rank, and
// collective memory when kAuto), after checking that comm, host_comm, the device and
// collective_memory fit together. InvalidArgument naming the mismatch and what to set.
Result<EngineOptions> ResolveRankOptions(const EngineOptions& options);

}  // namespace strata::engine_internal
