// The Gloo backend of strata::Communicator (strata/comm.h): TCP transport, rendezvous through
// Gloo's FileStore or RedisStore. Create it with CreateGlooCommunicator() (declared in
// strata/comm.h); this header exposes only the pieces tests exercise directly. No Gloo
// headers here, so strata_engine's users need not see them.
//
// How it runs: one worker thread per communicator executes the collectives in issue order
// (one FIFO), each through Gloo's algorithms on one gloo::Context connected as a full mesh.
// A Gloo exception is caught on the worker and becomes the handle's Status: Timeout when a
// peer stayed silent past the timeout, Comm when a connection broke. The lost rank is named
// when the exception names one of its TCP endpoints (every rank publishes them in the store
// after connecting, key "<prefix>/addr/<rank>"), or when another rank that saw it directly
// reported it through the store (key "<prefix>/err/<rank>"). Ranks on the same host are
// checked first through /proc: a peer process that has exited is named directly.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::gloo_internal {

// True when this build's Gloo has RedisStore (GLOO_USE_REDIS).
bool HasRedis();

// The rank r one of whose TCP endpoints (`endpoints[r]`, "[127.0.0.1]:40121") appears in
// `message`, if any. An address is only matched when not followed by another digit (so
// "[127.0.0.1]:4012" does not match "[127.0.0.1]:40121").
std::optional<int> FindRankInMessage(std::string_view message,
                                     const std::vector<std::vector<std::string>>& endpoints);

// This process's TCP endpoints ("[ip]:port", from /proc/self/fd and /proc/net/tcp{,6}):
// its listening sockets and the local ends of its connections, each in two forms (true
// port, and the byte-swapped port Gloo prints). Empty where /proc is absent. When
// `established` is given, it receives the number of connected (ESTABLISHED) sockets.
std::vector<std::string> LocalTcpEndpoints(int* established = nullptr);

// "host pid starttime" of this process, published by each rank so that ranks on the same
// host can tell whether it is gone.
std::string ProcessIdentity();
// Field 22 (starttime) of a /proc/<pid>/stat line, "" when malformed.
std::string StartTimeFromStat(const std::string& stat);
// True when `identity` (from ProcessIdentity) names a process on this host that has exited
// (absent, a zombie, or its pid reused). False when alive, on another host, or unknown.
bool ProcessIsGone(const std::string& identity);

// Reduce-scatter runs in pieces of at most `elements` (summed over ranks) to bound its
// scratch memory (default 2^24). Lets tests cover the piecewise path with small buffers;
// set it before creating communicators (it is read by every rank's worker).
void SetReduceScatterPieceForTesting(size_t elements);

}  // namespace strata::gloo_internal
