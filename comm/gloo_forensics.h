// Peer-loss forensics of the Gloo backend: when a collective fails, which rank was lost and
// on which host. Gloo's exceptions say only "connection closed by [ip]:port" or "timed out";
// these functions turn that into "lost rank 2 (host 10.0.0.7)".
//
// The lost rank is named, in order of trust: a rank on this host whose process has exited
// (checked through /proc against the "host pid starttime" every rank publishes, key
// "<prefix>/proc/<rank>"); the rank another rank reported after seeing it directly (key
// "<prefix>/err/<rank>"); or the rank one of whose TCP endpoints (published under
// "<prefix>/addr/<rank>" after connecting) appears in this rank's own message.
//
// No Gloo headers here (the tests include this file); PeerLossForensics uses the store of
// comm/gloo_store.h through a forward declaration.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::gloo_internal {

class GlooKeyValueStore;

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

// Gloo's tcp Address::str() reads "[127.0.0.1]:897" (a pair's address may append "$seq");
// the peer named in error messages uses the same form, so matching uses it as is.
std::string ListenAddressFromPairAddress(std::string s);
// "[127.0.0.1]:897" -> "127.0.0.1": the host is what helps a user find the lost rank (the
// port Gloo prints is in network byte order, so it would only mislead).
std::string ReadableHost(const std::string& s);
// Drops Gloo's "[/path/to/file.cc:123] " source prefixes, which mean nothing to users.
std::string CleanGlooMessage(std::string_view what);
// True when a (cleaned) Gloo message reports a timeout rather than a broken connection.
bool LooksLikeTimeout(std::string_view msg);

// What one rank knows about the others for naming a lost one: their addresses, endpoints
// and process identities (gathered once the mesh is connected), and the store where ranks
// report what they saw. Used by the collective worker only (one thread).
class PeerLossForensics {
 public:
  PeerLossForensics(int rank, int world_size, std::chrono::milliseconds timeout,
                    std::shared_ptr<GlooKeyValueStore> kv, std::vector<std::string> addresses,
                    std::vector<std::vector<std::string>> endpoints,
                    std::vector<std::string> identities);

  // Turns a Gloo exception message (`what`) of collective `op_name` into a Status naming
  // the lost rank when possible (Timeout when nothing arrived within the timeout, Comm when
  // a connection broke), and reports it through the store so that ranks that only saw a
  // timeout can name it too. May wait up to min(timeout/4, 2 s) for other ranks' reports.
  Status Failure(const char* op_name, const std::string& what);

 private:
  // The lowest-numbered other rank on this host whose process has exited without
  // reporting a failure of its own, if any.
  std::optional<int> DeadLocalRank();
  // The lost rank named by the lowest-numbered other rank that reported one, if any.
  std::optional<int> ReportedLostRank(int* reporter);
  // The one other rank that has reported no failure, if exactly one has not.
  std::optional<int> SilentRank();

  const int rank_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<GlooKeyValueStore> kv_;
  std::vector<std::string> addresses_;  // rank r's listening address, "[ip]:port"
  // Every TCP endpoint of rank r (its listening address and the local ends of its
  // connections): Gloo names a peer by whichever end it sees.
  std::vector<std::vector<std::string>> endpoints_;
  // "host pid starttime" of each rank, to check whether ranks on this host are gone.
  std::vector<std::string> identities_;
};

}  // namespace strata::gloo_internal
