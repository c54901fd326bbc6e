// The rendezvous stores of the Gloo backend: a folder every rank sees (Gloo's FileStore) or
// a Redis server (Gloo's RedisStore), behind strata's KeyValueStore (what OpenKeyValueStore
// returns and Communicator::store() hands out) and behind gloo::rendezvous::Store (what
// Gloo's full-mesh connect reads and writes). Both wrappers share one StoreCore, whose lock
// serialises every call: Gloo's stores are not thread-safe.
//
// Internal to comm/: includes Gloo headers, so only comm/'s Gloo files include it.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm.h"
#include "strata/status.h"

namespace strata::gloo_internal {

// The raw Gloo store plus a non-blocking existence check, shared by the KeyValueStore
// wrapper and the Gloo rendezvous. Gloo's stores are not thread-safe: calls go through mu.
// With Redis, every key lies under the rendezvous' PREFIX/ (`ns`), and the keys this
// process wrote are deleted when the last owner lets go (a run that ended leaves nothing
// for the next run with the same prefix to trip on); a folder is the run's own and keeps the
// keys of a run that joined (keep_written), and loses those of one that did not.
//
// Values as stored: with a run secret, 'h' + HMAC-SHA256(secret, key + '\0' + payload) +
// payload; without one, 'v' + payload for the KeyValueStore's keys (FileStore refuses to
// read back an empty file) and the bare payload for Gloo's own keys. A value that does not
// verify is "foreign": never handed to the caller.
struct StoreCore {
  ~StoreCore();
  // The store's name for `key` of a store prefix: "<ns><prefix>/<key>".
  std::string Key(const std::string& prefix, const std::string& key) const {
    return ns + prefix + "/" + key;
  }
  // What a refused stale key should tell the user to do (REQUIRES: nothing).
  std::string StaleKeyAdvice() const;

  // `payload` as stored under `full` (tagged: a KeyValueStore key, else one of Gloo's).
  std::vector<char> Seal(const std::string& full, std::string_view payload, bool tagged) const;
  enum class Found { kAbsent, kOk, kForeign };
  // Reads `full`: kOk with *payload, kAbsent, or kForeign with *why (what is wrong with the
  // value, for messages). REQUIRES: mu held. Throws what Gloo's store throws.
  Found Fetch(const std::string& full, bool tagged, std::string* payload, std::string* why);
  // Logs, once per key, that a foreign value under `full` is ignored. REQUIRES: mu held.
  void WarnForeign(const std::string& full, const std::string& why);
  // Replaces a foreign value under `full` with `data`. REQUIRES: mu held. Throws as Gloo.
  void Overwrite(const std::string& full, const std::vector<char>& data);

  std::mutex mu;
  std::unique_ptr<gloo::rendezvous::Store> store;
  std::function<bool(const std::string&)> has;  // REQUIRES: mu held
  // The value, or nullopt when absent, in one look (REQUIRES: mu held).
  std::function<std::optional<std::vector<char>>(const std::string&)> get_if;
  // Deletes the keys (REQUIRES: mu held).
  std::function<void(const std::vector<std::string>&)> erase;
  std::vector<std::string> written;  // keys this process set (REQUIRES: mu held)
  bool keep_written = false;         // a folder of a run that joined keeps its keys
  std::vector<std::string> warned;   // foreign keys already logged (REQUIRES: mu held)
  RendezvousSpec spec;
  std::string secret;  // the run secret; "" = values are not signed
  std::string ns;      // "PREFIX/" of a Redis rendezvous, else ""
  std::string where;   // "file:/x" for messages
};

// The signal number when the process-wide interrupt check (SetRendezvousInterruptCheck)
// says the process is asked to stop, else 0.
int RendezvousInterrupted();

// Thrown through Gloo's connectFullMesh when the wait for a key is interrupted by a signal.
struct RendezvousInterruptedError : std::exception {
  explicit RendezvousInterruptedError(int sig) : signal(sig) {}
  const char* what() const noexcept override { return "rendezvous interrupted by a signal"; }
  int signal;
};

// "interrupted by SIGTERM while waiting in rendezvous W for <what>", as an Aborted status.
Status InterruptedStatus(int signal, const std::string& where, const std::string& what);

// Opens the folder or connects to the Redis server `spec` names. NotFound/IOError naming
// the folder (missing, not writable) or the server (unreachable); NotSupported for redis:
// when this build's Gloo lacks Redis.
Result<std::shared_ptr<StoreCore>> OpenStoreCore(const RendezvousSpec& spec);

// strata's KeyValueStore over a StoreCore; every key is prefixed with "<prefix>/". Keys are
// written once: Set refuses an existing key (a stale folder from an earlier run).
class GlooKeyValueStore final : public KeyValueStore {
 public:
  GlooKeyValueStore(std::shared_ptr<StoreCore> core, std::string prefix)
      : core_(std::move(core)), prefix_(std::move(prefix)) {}

  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  // Non-blocking: the value when present.
  std::optional<std::string> TryGet(const std::string& key);
  // Non-blocking: the value when present, nullopt when absent; IOError when the store does
  // not answer (a Redis server that went away), naming it.
  Result<std::optional<std::string>> Peek(const std::string& key);

 private:
  std::shared_ptr<StoreCore> core_;
  std::string prefix_;
};

// Adapts StoreCore (with its lock) to gloo::rendezvous::Store for connectFullMesh; keys are
// prefixed with "<prefix>/". Throws what Gloo's stores throw (gloo::IoException on a wait
// past its timeout, naming any foreign value seen), as Gloo expects of a Store, and
// RendezvousInterruptedError when the process is asked to stop while waiting.
class LockedGlooStore final : public gloo::rendezvous::Store {
 public:
  LockedGlooStore(std::shared_ptr<StoreCore> core, std::string prefix)
      : core_(std::move(core)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<StoreCore> core_;
  std::string prefix_;

 public:
  // The key of the last set or get (its full name): when Gloo fails on what it read or
  // wrote (a malformed key, one set already), the error names this key.
  std::string last_key;
};

}  // namespace strata::gloo_internal
