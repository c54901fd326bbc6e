// The rendezvous stores of the Gloo backend; see gloo_store.h.
#include "comm/gloo_store.h"

#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/rendezvous/file_store.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>
#if GLOO_USE_REDIS
#define HIREDIS_NESTED_INCLUDE 1
#include <gloo/rendezvous/redis_store.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>

#include "comm/gloo_forensics.h"
#include "comm/run_secret.h"
#include "strata/env.h"
#include "strata/log.h"

namespace strata::gloo_internal {
namespace {

using namespace std::chrono_literals;

// FileStore::check is protected; the error reporting needs a non-blocking existence check.
class CheckableFileStore : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool Has(const std::string& key) { return check({key}); }
  void Erase(const std::vector<std::string>& keys) {
    for (const std::string& k : keys) ::unlink(objectPath(k).c_str());
  }
};

#if GLOO_USE_REDIS
// Gloo's RedisStore never deletes a key; this one can (its hiredis context is protected).
class ErasableRedisStore : public gloo::rendezvous::RedisStore {
 public:
  using RedisStore::RedisStore;
  void Erase(const std::vector<std::string>& keys) {
    for (const std::string& k : keys) {
      void* reply = redisCommand(redis_, "DEL %b", k.data(), k.size());
      if (reply == nullptr) return;  // the server is gone: nothing more to delete there
      freeReplyObject(reply);
    }
  }
  // EXISTS and GET in one (atomic: a key deleted between Gloo's check and get made its
  // GET fail an assertion): the value, or nullopt when the key is absent. Throws
  // gloo::IoException with hiredis' words when the connection is gone, std::runtime_error
  // quoting the server's error reply (NOAUTH, ...) otherwise.
  std::optional<std::vector<char>> GetIfPresent(const std::string& key) {
    auto* reply = static_cast<redisReply*>(redisCommand(redis_, "GET %b", key.data(), key.size()));
    if (reply == nullptr) {
      throw gloo::IoException(std::string("Redis connection lost: ") + redis_->errstr);
    }
    std::optional<std::vector<char>> out;
    std::string err;
    if (reply->type == REDIS_REPLY_STRING) {
      out.emplace(reply->str, reply->str + reply->len);
    } else if (reply->type == REDIS_REPLY_ERROR) {
      err.assign(reply->str, reply->len);
    } else if (reply->type != REDIS_REPLY_NIL) {
      err = "a reply of type " + std::to_string(reply->type) + " to GET";
    }
    freeReplyObject(reply);
    if (!err.empty()) throw std::runtime_error(ServerAnswered(err));
    return out;
  }
  static std::string ServerAnswered(const std::string& err) {
    std::string m = "the server answered '" + err + "'";
    if (err.rfind("NOAUTH", 0) == 0 || err.rfind("NOPERM", 0) == 0 ||
        err.rfind("WRONGPASS", 0) == 0) {
      m += " (authentication: give the password in STRATA_REDIS_PASSWORD or the URL)";
    }
    return m;
  }
  // Sends `argv` (AUTH, PING); "" when the server accepted it, else its error reply (or
  // hiredis' error when the connection failed).
  std::string Command(const std::vector<std::string>& argv) {
    std::vector<const char*> args;
    std::vector<size_t> lens;
    for (const std::string& a : argv) {
      args.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(redis_, static_cast<int>(args.size()), args.data(), lens.data()));
    if (reply == nullptr) return redis_->errstr[0] != '\0' ? redis_->errstr : "no reply";
    std::string err;
    if (reply->type == REDIS_REPLY_ERROR) err.assign(reply->str, reply->len);
    freeReplyObject(reply);
    return err;
  }
};

// The server's answer to AUTH (when a password is known) and PING, as the rendezvous'
// error: a server that wants a password, or refused the one given, says so by name.
Status Authenticate(ErasableRedisStore& rs, const RendezvousSpec& spec,
                    const std::string& password) {
  const std::string where = "Redis rendezvous " + spec.ToString();
  if (!password.empty()) {
    std::vector<std::string> argv = {"AUTH"};
    if (!spec.user.empty()) argv.push_back(spec.user);
    argv.push_back(password);
    if (std::string err = rs.Command(argv); !err.empty()) {
      return Status::InvalidArgument(
          where + ": authentication failed: the server answered '" + err + "' to AUTH" +
          (spec.user.empty() ? "" : " as user '" + spec.user + "'") +
          "; check the password (in the URL as redis://[USER]:PASSWORD@HOST, or "
          "STRATA_REDIS_PASSWORD) against the server's requirepass or ACL users");
    }
  }
  if (std::string err = rs.Command({"PING"}); !err.empty()) {
    if (err.rfind("NOAUTH", 0) == 0 || err.rfind("NOPERM", 0) == 0) {
      return Status::InvalidArgument(
          where + ": authentication needed: the server answered '" + err +
          "'; give its password in STRATA_REDIS_PASSWORD (kept out of ps) or in the URL as "
          "redis://:PASSWORD@HOST:PORT/PREFIX (redis://USER:PASSWORD@... for an ACL user)");
    }
    return Status::IOError(where + ": the server answered '" + err + "' to PING");
  }
  return Status::OK();
}
#endif

// Values get a one-byte tag because FileStore refuses to read back an empty file; a signed
// value has its own (StoreCore's comment has the layout).
constexpr char kValueTag = 'v';
constexpr char kSignedTag = 'h';

std::atomic<int (*)()> g_interrupt_check{nullptr};

HmacSha256Digest ValueMac(const std::string& secret, const std::string& full,
                          std::string_view payload) {
  std::string msg = full;
  msg.push_back('\0');
  msg.append(payload);
  return HmacSha256(secret, msg);
}

// Connects to host:port and closes again (5 s at most); IOError naming `what` otherwise.
[[maybe_unused]] Status ProbeTcp(const std::string& host, int port, const std::string& what) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return Status::IOError(what + ": host '" + host + "' does not resolve (" + gai_strerror(rc) +
                           ")");
  }
  int last_err = ECONNREFUSED;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      r = ::poll(&p, 1, 5000) == 1 ? 0 : -1;
      int err = r == 0 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (r == 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    last_err = errno;
    ::close(fd);
    if (r == 0) {
      ::freeaddrinfo(res);
      return Status::OK();
    }
  }
  ::freeaddrinfo(res);
  return Status::FromErrno(last_err, "connecting to " + what + " (is the server running there?)")
      .WithErrno(last_err);
}

}  // namespace

StoreCore::~StoreCore() {
  if (!erase || keep_written || written.empty()) return;
  try {
    erase(written);
  } catch (const std::exception& e) {  // a store that went away: nothing left to delete
    LogDebug(std::string("rendezvous: deleting this rank's keys: ") + e.what());
  }
}

std::vector<char> StoreCore::Seal(const std::string& full, std::string_view payload,
                                  bool tagged) const {
  std::vector<char> data;
  if (!secret.empty()) {
    const HmacSha256Digest mac = ValueMac(secret, full, payload);
    data.reserve(1 + mac.size() + payload.size());
    data.push_back(kSignedTag);
    data.insert(data.end(), mac.begin(), mac.end());
  } else if (tagged) {
    data.push_back(kValueTag);
  }
  data.insert(data.end(), payload.begin(), payload.end());
  return data;
}

StoreCore::Found StoreCore::Fetch(const std::string& full, bool tagged, std::string* payload,
                                  std::string* why) {
  std::optional<std::vector<char>> got = get_if(full);
  if (!got) return Found::kAbsent;
  const std::vector<char>& data = *got;
  const bool signed_value = data.size() > kHmacSha256Bytes && data[0] == kSignedTag;
  if (!secret.empty()) {
    if (!signed_value) {
      *why =
          "it carries no HMAC (written without a run secret: by another run, or a process "
          "that is not one of this run's ranks)";
      return Found::kForeign;
    }
    HmacSha256Digest mac;
    std::memcpy(mac.data(), data.data() + 1, mac.size());
    std::string_view rest(data.data() + 1 + mac.size(), data.size() - 1 - mac.size());
    if (!DigestsEqual(mac, ValueMac(secret, full, rest))) {
      *why =
          "its HMAC does not verify with this run's secret (another run, or a process "
          "without the secret, wrote it; or the ranks were given different secrets)";
      return Found::kForeign;
    }
    payload->assign(rest);
    return Found::kOk;
  }
  if (signed_value && tagged) {
    *why =
        "it is signed with a run secret, and this rank has none: give every rank the same "
        "--run-secret (or STRATA_RUN_SECRET)";
    return Found::kForeign;
  }
  if (!tagged) {
    payload->assign(data.begin(), data.end());
    return Found::kOk;
  }
  if (data.empty() || data[0] != kValueTag) {
    *why = "it was not written by strata";
    return Found::kForeign;
  }
  payload->assign(data.begin() + 1, data.end());
  return Found::kOk;
}

void StoreCore::WarnForeign(const std::string& full, const std::string& why) {
  if (std::find(warned.begin(), warned.end(), full) != warned.end()) return;
  warned.push_back(full);
  LogWarning("rendezvous " + where + ": ignoring key '" + full + "': " + why +
             "; waiting for this run's own value");
}

void StoreCore::Overwrite(const std::string& full, const std::vector<char>& data) {
  LogWarning("rendezvous " + where + ": replacing key '" + full +
             "', which this run did not write (it does not verify with the run secret)");
  if (erase) erase({full});
  store->set(full, data);
}

int RendezvousInterrupted() {
  int (*check)() = g_interrupt_check.load();
  return check == nullptr ? 0 : check();
}

Status InterruptedStatus(int signal, const std::string& where, const std::string& what) {
  const char* abbrev = ::sigabbrev_np(signal);
  return Status::Aborted(
      "interrupted by " +
      (abbrev != nullptr ? "SIG" + std::string(abbrev) : "signal " + std::to_string(signal)) +
      " while waiting in rendezvous " + where + " for " + what +
      "; the keys this rank wrote there are deleted");
}

std::string StoreCore::StaleKeyAdvice() const {
  if (spec.kind == RendezvousSpec::Kind::kFile) {
    return "left over from an earlier run? use a fresh folder (or another store prefix) per run";
  }
  const std::string cli = "redis-cli -h " + spec.host + " -p " + std::to_string(spec.port);
  return "left over from an earlier run that did not end cleanly (a run that ends deletes its "
         "keys)? use another prefix (redis://" +
         spec.host + ":" + std::to_string(spec.port) +
         "/NEW-PREFIX), or delete the old keys: " + cli + " --scan --pattern '" + ns +
         "*' | xargs -r " + cli + " del";
}

// Gloo's and hiredis' words for a server that went away, as the rendezvous' error.
std::string StoreFailure(const StoreCore& core, const std::string& what) {
  if (core.spec.kind == RendezvousSpec::Kind::kFile) return what;
  // An error reply (NOAUTH, ...) comes from a server that is there.
  if (what.find("the server answered") != std::string::npos) return what;
  return what + " (the Redis server at " + core.spec.host + ":" + std::to_string(core.spec.port) +
         " stopped answering: is redis-server still running there? restart it, then the run)";
}

Status GlooKeyValueStore::Set(const std::string& key, std::string_view value) {
  std::string full = core_->Key(prefix_, key);
  std::lock_guard<std::mutex> lock(core_->mu);
  try {
    const std::vector<char> data = core_->Seal(full, value, /*tagged=*/true);
    std::string existing, why;
    const StoreCore::Found found =
        core_->secret.empty()
            ? (core_->has(full) ? StoreCore::Found::kOk : StoreCore::Found::kAbsent)
            : core_->Fetch(full, /*tagged=*/true, &existing, &why);
    if (found == StoreCore::Found::kOk) {
      return Status::InvalidArgument("key '" + full + "' already exists in rendezvous " +
                                     core_->where + ": " + core_->StaleKeyAdvice());
    }
    // With a run secret, a key that does not verify is not this run's: one this rank owns
    // is taken over, so that a planted or stale key cannot block the prefix.
    if (found == StoreCore::Found::kForeign) {
      core_->Overwrite(full, data);
    } else {
      core_->store->set(full, data);
    }
    core_->written.push_back(full);
  } catch (const std::exception& e) {
    return Status::IOError(StoreFailure(*core_, "setting key '" + full + "' in rendezvous " +
                                                    core_->where + ": " +
                                                    CleanGlooMessage(e.what())));
  }
  return Status::OK();
}

Result<std::string> GlooKeyValueStore::Get(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  std::string full = core_->Key(prefix_, key);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string foreign;  // why the last value seen under the key was refused
  // Polls rather than calling Store::wait, so that the lock is not held while waiting and
  // the timeout has millisecond resolution (FileStore::wait counts whole seconds).
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      try {
        std::string payload, why;
        switch (core_->Fetch(full, /*tagged=*/true, &payload, &why)) {
          case StoreCore::Found::kOk:
            return payload;
          case StoreCore::Found::kAbsent:
            break;
          case StoreCore::Found::kForeign:
            // Without a secret a rank cannot tell another run's key from its own run's: it
            // stops here. With one, this run's rank may still overwrite the key.
            if (core_->secret.empty()) {
              return Status::Corruption("key '" + full + "' in rendezvous " + core_->where +
                                        " is refused: " + why + "; " + core_->StaleKeyAdvice());
            }
            core_->WarnForeign(full, why);
            foreign = why;
            break;
        }
      } catch (const std::exception& e) {
        return Status::IOError(StoreFailure(*core_, "reading key '" + full + "' from rendezvous " +
                                                        core_->where + ": " +
                                                        CleanGlooMessage(e.what())));
      }
    }
    if (const int sig = RendezvousInterrupted(); sig != 0) {
      return InterruptedStatus(sig, core_->where, "key '" + full + "'");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout(
          "key '" + full + "' did not appear in rendezvous " + core_->where + " within " +
          std::to_string(timeout.count()) + " ms" +
          (foreign.empty() ? "" : " (a value was there, refused: " + foreign + ")"));
    }
    std::this_thread::sleep_for(5ms);
  }
}

std::optional<std::string> GlooKeyValueStore::TryGet(const std::string& key) {
  Result<std::string> r = Get(key, 0ms);
  if (!r.ok()) return std::nullopt;
  return *r;
}

Result<std::optional<std::string>> GlooKeyValueStore::Peek(const std::string& key) {
  Result<std::string> r = Get(key, 0ms);
  if (r.ok()) return std::optional<std::string>(*r);
  if (r.status().code() == StatusCode::kTimeout) return std::optional<std::string>();
  return r.status();
}

void LockedGlooStore::set(const std::string& key, const std::vector<char>& data) {
  std::lock_guard<std::mutex> lock(core_->mu);
  const std::string full = core_->Key(prefix_, key);
  last_key = full;
  const std::vector<char> sealed =
      core_->Seal(full, std::string_view(data.data(), data.size()), /*tagged=*/false);
  std::string existing, why;
  if (!core_->secret.empty() &&
      core_->Fetch(full, /*tagged=*/false, &existing, &why) == StoreCore::Found::kForeign) {
    core_->Overwrite(full, sealed);
  } else {
    core_->store->set(full, sealed);
  }
  core_->written.push_back(full);
}

std::vector<char> LockedGlooStore::get(const std::string& key) {
  wait({key}, kDefaultTimeout);
  std::lock_guard<std::mutex> lock(core_->mu);
  const std::string full = core_->Key(prefix_, key);
  last_key = full;
  std::string payload, why;
  if (core_->Fetch(full, /*tagged=*/false, &payload, &why) != StoreCore::Found::kOk) {
    throw gloo::IoException("key '" + full + "' in rendezvous " + core_->where +
                            " is refused: " + why);
  }
  return std::vector<char>(payload.begin(), payload.end());
}

void LockedGlooStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string foreign;  // "key 'K': why" of the last refused value
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      bool all = true;
      for (const std::string& k : keys) {
        const std::string full = core_->Key(prefix_, k);
        std::string payload, why;
        const StoreCore::Found f = core_->Fetch(full, /*tagged=*/false, &payload, &why);
        if (f == StoreCore::Found::kForeign) {
          core_->WarnForeign(full, why);
          foreign = "key '" + full + "': " + why;
        }
        all = all && f == StoreCore::Found::kOk;
      }
      if (all) return;
    }
    if (const int sig = RendezvousInterrupted(); sig != 0) throw RendezvousInterruptedError(sig);
    if (timeout != gloo::kNoTimeout && std::chrono::steady_clock::now() >= deadline) {
      throw gloo::IoException("Wait timeout for rendezvous key(s) in " + core_->where +
                              (foreign.empty() ? "" : " (refused " + foreign + ")"));
    }
    std::this_thread::sleep_for(5ms);
  }
}

bool HasRedis() { return GLOO_USE_REDIS != 0; }

}  // namespace strata::gloo_internal

namespace strata {
void SetRendezvousInterruptCheck(int (*check)()) { gloo_internal::g_interrupt_check = check; }
}  // namespace strata

namespace strata::gloo_internal {

Result<std::shared_ptr<StoreCore>> OpenStoreCore(const RendezvousSpec& spec) {
  auto core = std::make_shared<StoreCore>();
  core->spec = spec;
  core->where = spec.ToString();
  // A folder keeps what is written through OpenKeyValueStore (it is the run's own);
  // CreateGlooCommunicator deletes a rank's keys there when its join fails.
  core->keep_written = spec.kind == RendezvousSpec::Kind::kFile;
  core->secret = spec.run_secret.empty() ? EnvGet("STRATA_RUN_SECRET") : spec.run_secret;
  if (spec.kind == RendezvousSpec::Kind::kRedis && !spec.prefix.empty())
    core->ns = spec.prefix + "/";
  if (spec.kind == RendezvousSpec::Kind::kFile) {
    if (::access(spec.path.c_str(), F_OK) != 0) {
      return Status::FromErrno(errno, "rendezvous folder " + spec.path +
                                          " (create it, on a file system every rank sees)")
          .WithPath(spec.path);
    }
    if (::access(spec.path.c_str(), W_OK | X_OK) != 0) {
      return Status::FromErrno(errno, "rendezvous folder " + spec.path + " is not writable")
          .WithPath(spec.path);
    }
    try {
      auto fs = std::make_unique<CheckableFileStore>(spec.path);
      CheckableFileStore* raw = fs.get();
      core->has = [raw](const std::string& key) { return raw->Has(key); };
      core->get_if = [raw](const std::string& key) -> std::optional<std::vector<char>> {
        if (!raw->Has(key)) return std::nullopt;
        return raw->get(key);
      };
      core->erase = [raw](const std::vector<std::string>& keys) { raw->Erase(keys); };
      core->store = std::move(fs);
    } catch (const std::exception& e) {
      return Status::IOError("opening rendezvous folder " + spec.path + ": " +
                             CleanGlooMessage(e.what()))
          .WithPath(spec.path);
    }
    return core;
  }
#if GLOO_USE_REDIS
  // RedisStore's constructor leaks its hiredis context when the server is unreachable;
  // probing first also gives a plain errno message.
  STRATA_RETURN_IF_ERROR(ProbeTcp(spec.host, spec.port, "Redis rendezvous " + spec.ToString()));
  try {
    auto rs = std::make_unique<ErasableRedisStore>(spec.host, spec.port);
    ErasableRedisStore* raw = rs.get();
    STRATA_RETURN_IF_ERROR(Authenticate(
        *raw, spec, spec.password.empty() ? EnvGet("STRATA_REDIS_PASSWORD") : spec.password));
    core->has = [raw](const std::string& key) { return raw->GetIfPresent(key).has_value(); };
    core->get_if = [raw](const std::string& key) { return raw->GetIfPresent(key); };
    core->erase = [raw](const std::vector<std::string>& keys) { raw->Erase(keys); };
    core->store = std::move(rs);
  } catch (const std::exception& e) {
    return Status::IOError("connecting to Redis rendezvous " + spec.ToString() + ": " +
                           CleanGlooMessage(e.what()) + " (is redis-server running there?)");
  }
  return core;
#else
  return Status::NotSupported("rendezvous " + spec.ToString() +
                              ": this build's Gloo has no Redis support; use file:DIR on a "
                              "folder every rank sees");
#endif
}

}  // namespace strata::gloo_internal
