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

#include "comm/gloo_forensics.h"

namespace strata::gloo_internal {
namespace {

using namespace std::chrono_literals;

// FileStore::check is protected; the error reporting needs a non-blocking existence check.
class CheckableFileStore : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool Has(const std::string& key) { return check({key}); }
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
};
#endif

// Values get a one-byte tag because FileStore refuses to read back an empty file.
constexpr char kValueTag = 'v';

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
  if (erase && !written.empty()) erase(written);
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
  return what + " (the Redis server at " + core.spec.host + ":" + std::to_string(core.spec.port) +
         " stopped answering: is redis-server still running there? restart it, then the run)";
}

Status GlooKeyValueStore::Set(const std::string& key, std::string_view value) {
  std::string full = core_->Key(prefix_, key);
  std::vector<char> data;
  data.reserve(value.size() + 1);
  data.push_back(kValueTag);
  data.insert(data.end(), value.begin(), value.end());
  std::lock_guard<std::mutex> lock(core_->mu);
  try {
    if (core_->has(full)) {
      return Status::InvalidArgument("key '" + full + "' already exists in rendezvous " +
                                     core_->where + ": " + core_->StaleKeyAdvice());
    }
    core_->store->set(full, data);
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
  // Polls rather than calling Store::wait, so that the lock is not held while waiting and
  // the timeout has millisecond resolution (FileStore::wait counts whole seconds).
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      try {
        if (core_->has(full)) {
          std::vector<char> data = core_->store->get(full);
          if (data.empty() || data[0] != kValueTag) {
            return Status::Corruption("key '" + full + "' in rendezvous " + core_->where +
                                      " was not written by strata");
          }
          return std::string(data.begin() + 1, data.end());
        }
      } catch (const std::exception& e) {
        return Status::IOError(StoreFailure(*core_, "reading key '" + full + "' from rendezvous " +
                                                        core_->where + ": " +
                                                        CleanGlooMessage(e.what())));
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout("key '" + full + "' did not appear in rendezvous " + core_->where +
                             " within " + std::to_string(timeout.count()) + " ms");
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
  core_->store->set(full, data);
  core_->written.push_back(full);
}

std::vector<char> LockedGlooStore::get(const std::string& key) {
  wait({key}, kDefaultTimeout);
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->store->get(core_->Key(prefix_, key));
}

void LockedGlooStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      bool all = true;
      for (const std::string& k : keys) all = all && core_->has(core_->Key(prefix_, k));
      if (all) return;
    }
    if (timeout != gloo::kNoTimeout && std::chrono::steady_clock::now() >= deadline) {
      throw gloo::IoException("Wait timeout for rendezvous key(s) in " + core_->where);
    }
    std::this_thread::sleep_for(5ms);
  }
}

bool HasRedis() { return GLOO_USE_REDIS != 0; }

Result<std::shared_ptr<StoreCore>> OpenStoreCore(const RendezvousSpec& spec) {
  auto core = std::make_shared<StoreCore>();
  core->spec = spec;
  core->where = spec.ToString();
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
    core->has = [raw](const std::string& key) { return raw->check({key}); };
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
