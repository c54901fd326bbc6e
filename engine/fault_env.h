// Faults from the environment, for crash and fault tests of whole runs (the `strata` binary
// run by a test): nothing here is read unless the variables are set.
//
//   STRATA_TEST_KILL_AT=POINT:N   SIGKILL the process the N-th time its swap store reaches
//                                 POINT (a SwapStoreOptions::test_hook point, e.g.
//                                 "commit_finishing:5", "write_submitted:40"), or its
//                                 activation stash reaches "activation_write_submitted" (a
//                                 spill to the scratch file in flight) or
//                                 "activation_read_submitted" (a read back in flight).
//   STRATA_TEST_FAULT=KIND@N[,KIND@N...]
//                                 wrap the NVMe backend in a fault-injecting one
//                                 (strata/fault_injection.h) that gives the N-th request of
//                                 KIND its fault: eio_read, eio_write, enospc_write,
//                                 short_write, flip_read, flip_write, sync_eio.
#pragma once

#include <functional>
#include <string_view>

#include "strata/io.h"
#include "strata/status.h"

namespace strata::engine_internal {

// The store's test hook for STRATA_TEST_KILL_AT; empty when unset or malformed.
std::function<void(std::string_view)> KillHookFromEnvironment();

// `factory` (empty: the default backend) wrapped for STRATA_TEST_FAULT; `factory` itself
// when unset. InvalidArgument naming the variable for a malformed value.
Result<IoBackendFactory> FaultsFromEnvironment(IoBackendFactory factory);

}  // namespace strata::engine_internal
