// The Gloo backend of strata::Communicator (strata/comm.h): TCP transport, rendezvous through
// Gloo's FileStore or RedisStore. Create it with CreateGlooCommunicator() (declared in
// strata/comm.h); this header exposes only the pieces tests exercise directly. No Gloo
// headers here, so strata_engine's users need not see them.
//
// How it runs: one worker thread per communicator executes the collectives in issue order
// (one FIFO), each through Gloo's algorithms on one gloo::Context connected as a full mesh.
// A Gloo exception is caught on the worker and becomes the handle's Status: Timeout when a
// peer stayed silent past the timeout, Comm when a connection broke. The lost rank is named
// when the exception names its address, or when another rank that saw it directly reported
// it through the store (key "<prefix>/err/<rank>").
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::gloo_internal {

// True when this build's Gloo has RedisStore (GLOO_USE_REDIS).
bool HasRedis();

// The rank whose listening address ("127.0.0.1:40121") appears in `message`, if any.
// `rank_addresses[r]` is rank r's address; empty entries are skipped. An address is only
// matched when not followed by another digit (so ":4012" does not match ":40121").
std::optional<int> FindRankInMessage(std::string_view message,
                                     const std::vector<std::string>& rank_addresses);

// Reduce-scatter runs in pieces of at most `elements` (summed over ranks) to bound its
// scratch memory (default 2^24). Lets tests cover the piecewise path with small buffers;
// set it before creating communicators (it is read by every rank's worker).
void SetReduceScatterPieceForTesting(size_t elements);

}  // namespace strata::gloo_internal
