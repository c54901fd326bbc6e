// Gloo backend of strata::Communicator. See engine/gloo_communicator.h for the design.
//
// Worker loop (GlooCommunicator::Run): pops one Op at a time in issue order; if the
// communicator is already broken the op fails with Aborted and the original cause, else it
// waits for the op's `after` event, runs the Gloo algorithm, and completes the handle.
// Nothing Gloo throws crosses this file's boundary: every call into Gloo is wrapped and the
// exception becomes a Status (Timeout / Comm / InvalidArgument), decorated with the lost
// rank when it can be inferred. The first failure breaks the communicator for good, since
// the ranks may now disagree on which collective they are in.
#include "engine/gloo_communicator.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>
#if GLOO_USE_REDIS
#define HIREDIS_NESTED_INCLUDE 1
#include <gloo/rendezvous/redis_store.h>
#endif

#include "strata/comm.h"
#include "strata/env.h"
#include "strata/log.h"

namespace strata {
namespace gloo_internal {

bool HasRedis() { return GLOO_USE_REDIS != 0; }

std::optional<int> FindRankInMessage(std::string_view message,
                                     const std::vector<std::vector<std::string>>& endpoints) {
  for (size_t r = 0; r < endpoints.size(); ++r) {
    for (const std::string& addr : endpoints[r]) {
      if (addr.empty()) continue;
      for (size_t pos = message.find(addr); pos != std::string_view::npos;
           pos = message.find(addr, pos + 1)) {
        size_t after = pos + addr.size();
        if (after < message.size() && message[after] >= '0' && message[after] <= '9') continue;
        return static_cast<int>(r);
      }
    }
  }
  return std::nullopt;
}

std::vector<std::string> LocalTcpEndpoints(int* established) {
  if (established != nullptr) *established = 0;
  // Socket inodes this process holds.
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code ec2;
    std::string target = std::filesystem::read_symlink(entry.path(), ec2).string();
    if (!ec2 && target.starts_with("socket:[") && target.ends_with("]")) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    const bool v6 = std::string_view(table).ends_with("6");
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      if (!(in >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >>
            inode)) {
        continue;
      }
      if (!inodes.count(inode)) continue;
      if (established != nullptr && st == "01") ++*established;
      size_t colon = local.find(':');
      if (colon == std::string::npos) continue;
      std::string hex = local.substr(0, colon);
      unsigned port = std::stoul(local.substr(colon + 1), nullptr, 16);
      char text[INET6_ADDRSTRLEN] = {};
      // The kernel prints the address as 32-bit words in host byte order.
      if (!v6 && hex.size() == 8) {
        in_addr a;
        a.s_addr = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
        ::inet_ntop(AF_INET, &a, text, sizeof(text));
      } else if (v6 && hex.size() == 32) {
        in6_addr a;
        for (int w = 0; w < 4; ++w) {
          uint32_t word = static_cast<uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
          std::memcpy(reinterpret_cast<char*>(&a) + w * 4, &word, 4);
        }
        ::inet_ntop(AF_INET6, &a, text, sizeof(text));
      } else {
        continue;
      }
      out.push_back("[" + std::string(text) + "]:" + std::to_string(port));
      // Gloo's Address::str() prints sin_port without ntohs(): list that form as well.
      unsigned swapped = ((port & 0xff) << 8) | (port >> 8);
      if (swapped != port) out.push_back("[" + std::string(text) + "]:" + std::to_string(swapped));
    }
  }
  return out;
}

std::string ProcessIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream f("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return std::string(host) + " " + std::to_string(::getpid()) + " " + StartTimeFromStat(stat);
}

std::string StartTimeFromStat(const std::string& stat) {
  // Fields after the command name (which may contain spaces) start at ") ": state is field
  // 3, starttime field 22 of proc(5).
  size_t close = stat.rfind(") ");
  if (close == std::string::npos) return "";
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
}

bool ProcessIsGone(const std::string& identity) {
  std::istringstream in(identity);
  std::string host, pid_s, start;
  if (!(in >> host >> pid_s >> start)) return false;
  char me[256] = {};
  ::gethostname(me, sizeof(me) - 1);
  if (host != me) return false;  // another host: cannot tell from here
  std::ifstream f("/proc/" + pid_s + "/stat");
  if (!f) return true;  // no such process
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (StartTimeFromStat(stat) != start) return true;  // the pid was reused
  size_t close = stat.rfind(") ");
  char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
  return state == 'Z' || state == 'X';  // exited, not yet reaped
}

namespace {

// Gloo's tcp Address::str() reads "[127.0.0.1]:897" (a pair's address may append "$seq");
// the peer named in error messages uses the same form, so matching uses it as is.
std::string ListenAddressFromPairAddress(std::string s) {
  size_t dollar = s.find('$');
  if (dollar != std::string::npos) s.resize(dollar);
  return s;
}

// "[127.0.0.1]:897" -> "127.0.0.1": the host is what helps a user find the lost rank (the
// port Gloo prints is in network byte order, so it would only mislead).
std::string ReadableHost(const std::string& s) {
  size_t open = s.find('[');
  size_t close = s.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return s;
  return s.substr(open + 1, close - open - 1);
}

// Drops Gloo's "[/path/to/file.cc:123] " source prefixes, which mean nothing to users.
std::string CleanGlooMessage(std::string_view what) {
  std::string out;
  size_t i = 0;
  while (i < what.size()) {
    if (what[i] == '[') {
      size_t close = what.find(']', i);
      if (close != std::string_view::npos) {
        std::string_view inside = what.substr(i + 1, close - i - 1);
        if (inside.find(".cc:") != std::string_view::npos ||
            inside.find(".h:") != std::string_view::npos) {
          i = close + 1;
          while (i < what.size() && what[i] == ' ') ++i;
          continue;
        }
      }
    }
    out.push_back(what[i++]);
  }
  return out;
}

bool LooksLikeTimeout(std::string_view msg) {
  return msg.find("imed out") != std::string_view::npos ||
         msg.find("imeout") != std::string_view::npos;
}

}  // namespace
}  // namespace gloo_internal

namespace {

using namespace std::chrono_literals;
using gloo_internal::CleanGlooMessage;

// ------------------------------------------------------------------------------------------
// Store
// ------------------------------------------------------------------------------------------

// FileStore::check is protected; the error reporting needs a non-blocking existence check.
class CheckableFileStore : public gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool Has(const std::string& key) { return check({key}); }
};

// The raw Gloo store plus a non-blocking existence check, shared by the KeyValueStore
// wrapper and the Gloo rendezvous. Gloo's stores are not thread-safe: calls go through mu.
struct StoreCore {
  std::mutex mu;
  std::unique_ptr<gloo::rendezvous::Store> store;
  std::function<bool(const std::string&)> has;  // REQUIRES: mu held
  std::string where;                            // "file:/x" for messages
};

// Values get a one-byte tag because FileStore refuses to read back an empty file.
constexpr char kValueTag = 'v';

class GlooKeyValueStore final : public KeyValueStore {
 public:
  GlooKeyValueStore(std::shared_ptr<StoreCore> core, std::string prefix)
      : core_(std::move(core)), prefix_(std::move(prefix)) {}

  Status Set(const std::string& key, std::string_view value) override {
    std::string full = prefix_ + "/" + key;
    std::vector<char> data;
    data.reserve(value.size() + 1);
    data.push_back(kValueTag);
    data.insert(data.end(), value.begin(), value.end());
    std::lock_guard<std::mutex> lock(core_->mu);
    try {
      if (core_->has(full)) {
        return Status::InvalidArgument("key '" + full + "' already exists in rendezvous " +
                                       core_->where +
                                       ": left over from an earlier run? use a fresh folder "
                                       "(or another store prefix) per run");
      }
      core_->store->set(full, data);
    } catch (const std::exception& e) {
      return Status::IOError("setting key '" + full + "' in rendezvous " + core_->where + ": " +
                             CleanGlooMessage(e.what()));
    }
    return Status::OK();
  }

  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string full = prefix_ + "/" + key;
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
          return Status::IOError("reading key '" + full + "' from rendezvous " + core_->where +
                                 ": " + CleanGlooMessage(e.what()));
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::Timeout("key '" + full + "' did not appear in rendezvous " + core_->where +
                               " within " + std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(5ms);
    }
  }

  // Non-blocking: the value when present.
  std::optional<std::string> TryGet(const std::string& key) {
    Result<std::string> r = Get(key, 0ms);
    if (!r.ok()) return std::nullopt;
    return *r;
  }

 private:
  std::shared_ptr<StoreCore> core_;
  std::string prefix_;
};

// Adapts StoreCore (with its lock) to gloo::rendezvous::Store for connectFullMesh.
class LockedGlooStore final : public gloo::rendezvous::Store {
 public:
  LockedGlooStore(std::shared_ptr<StoreCore> core, std::string prefix)
      : core_(std::move(core)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->store->set(prefix_ + "/" + key, data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, kDefaultTimeout);
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->store->get(prefix_ + "/" + key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(core_->mu);
        bool all = true;
        for (const std::string& k : keys) all = all && core_->has(prefix_ + "/" + k);
        if (all) return;
      }
      if (timeout != gloo::kNoTimeout && std::chrono::steady_clock::now() >= deadline) {
        throw gloo::IoException("Wait timeout for rendezvous key(s) in " + core_->where);
      }
      std::this_thread::sleep_for(5ms);
    }
  }

 private:
  std::shared_ptr<StoreCore> core_;
  std::string prefix_;
};

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

Result<std::shared_ptr<StoreCore>> OpenStoreCore(const RendezvousSpec& spec) {
  auto core = std::make_shared<StoreCore>();
  core->where = spec.ToString();
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
    auto rs = std::make_unique<gloo::rendezvous::RedisStore>(spec.host, spec.port);
    gloo::rendezvous::RedisStore* raw = rs.get();
    core->has = [raw](const std::string& key) { return raw->check({key}); };
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

// ------------------------------------------------------------------------------------------
// Handles and ops
// ------------------------------------------------------------------------------------------

class GlooHandle final : public CommHandle::Impl {
 public:
  Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  bool Done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void Complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

struct Op {
  const char* name;
  std::string label;
  uint64_t bytes = 0;
  EventPtr after;
  // Runs the Gloo algorithm; may throw. The uint32 is a tag unique per op.
  std::function<void(uint32_t tag)> run;
  std::shared_ptr<GlooHandle> handle;
};

// Chunking of reduce-scatter so the scratch copy stays bounded and Gloo's int counts hold.
std::atomic<size_t> g_reduce_scatter_max_elements{size_t{1} << 24};  // 64 MiB of fp32

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const CommOptions& options, std::shared_ptr<StoreCore> core,
                   std::shared_ptr<GlooKeyValueStore> kv,
                   std::shared_ptr<gloo::rendezvous::Context> context,
                   std::vector<std::string> addresses,
                   std::vector<std::vector<std::string>> endpoints,
                   std::vector<std::string> identities)
      : rank_(options.rank.rank),
        world_(options.rank.world_size),
        timeout_(options.timeout),
        core_(std::move(core)),
        kv_(std::move(kv)),
        context_(std::move(context)),
        addresses_(std::move(addresses)),
        endpoints_(std::move(endpoints)),
        identities_(std::move(identities)) {
    worker_ = std::thread([this] { Run(); });
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // Closing the connections before the context goes tells peers at once that this rank
    // left (they see "connection closed" rather than waiting for their timeout).
    if (context_) {
      try {
        context_->closeConnections();
      } catch (const std::exception& e) {
        LogDebug(std::string("gloo: closing connections: ") + e.what());
      }
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "gloo"; }
  bool device_buffers() const override { return false; }
  std::shared_ptr<KeyValueStore> store() const override { return kv_; }
  void SetObserver(std::function<void(const CommOpRecord&)> observer) override {
    std::lock_guard<std::mutex> lock(mu_);
    observer_ = std::move(observer);
  }

  CommHandle AllGather(const void* input, void* output, size_t count, CommDataType type,
                       const CollectiveOptions& options) override {
    size_t esize = CommDataTypeSize(type);
    size_t bytes = count * esize;
    if (count > 0 && (input == nullptr || output == nullptr)) {
      return Invalid("all-gather: null buffer with count " + std::to_string(count));
    }
    auto* out = static_cast<uint8_t*>(output);
    const auto* in = static_cast<const uint8_t*>(input);
    bool in_place = in == out + static_cast<size_t>(rank_) * bytes;
    if (!in_place && count > 0 && Overlaps(in, bytes, out, bytes * world_)) {
      return Invalid("all-gather: input overlaps output other than at output + rank*count");
    }
    uint64_t bus = bytes * static_cast<uint64_t>(world_ - 1);
    return Enqueue("all-gather", options, bus, [=, this](uint32_t tag) {
      if (bytes == 0) return;
      if (world_ == 1) {
        if (!in_place) std::memcpy(out, in, bytes);
        return;
      }
      gloo::AllgatherOptions opts(context_);
      if (!in_place) opts.setInput(const_cast<uint8_t*>(in), bytes);
      opts.setOutput(out, bytes * world_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  CommHandle ReduceScatter(const void* input, void* output, size_t count, CommDataType type,
                           ReduceOp op, const CollectiveOptions& options) override {
    if (type != CommDataType::kFloat32) return Invalid("reduce-scatter: only fp32 is supported");
    if (op != ReduceOp::kSum && op != ReduceOp::kAverage) {
      return Invalid(std::string("reduce-scatter: op ") + ReduceOpName(op) +
                     " is not supported (sum or avg)");
    }
    if (count > 0 && (input == nullptr || output == nullptr)) {
      return Invalid("reduce-scatter: null buffer with count " + std::to_string(count));
    }
    const auto* in = static_cast<const float*>(input);
    auto* out = static_cast<float*>(output);
    const bool in_place = out == in + static_cast<size_t>(rank_) * count;
    if (!in_place && count > 0 && Overlaps(in, count * world_ * 4, out, count * 4)) {
      return Invalid("reduce-scatter: output overlaps input other than at input + rank*count");
    }
    uint64_t bus = count * 4 * static_cast<uint64_t>(world_ - 1);
    return Enqueue("reduce-scatter", options, bus, [=, this](uint32_t) {
      if (count == 0) return;
      if (world_ == 1) {
        if (!in_place) std::memcpy(out, in, count * sizeof(float));
        return;
      }
      // Gloo's ReduceScatterHalvingDoubling works in place on one buffer of world*piece
      // elements and leaves this rank's piece at its front. Pieces bound the scratch
      // memory and keep Gloo's int element counts in range. In place, piece k of the output
      // overwrites only input this rank has already copied (its own slot, up to piece k).
      size_t piece_max = std::max<size_t>(1, g_reduce_scatter_max_elements.load() / world_);
      std::vector<float> scratch(std::min(count, piece_max) * world_);
      for (size_t off = 0; off < count; off += piece_max) {
        size_t piece = std::min(piece_max, count - off);
        for (int r = 0; r < world_; ++r) {
          std::memcpy(scratch.data() + r * piece, in + r * count + off, piece * sizeof(float));
        }
        std::vector<int> recv_counts(world_, static_cast<int>(piece));
        gloo::ReduceScatterHalvingDoubling<float> algo(
            context_, std::vector<float*>{scratch.data()}, static_cast<int>(piece * world_),
            recv_counts);
        algo.run();
        float* dst = out + off;
        if (op == ReduceOp::kAverage) {
          const float n = static_cast<float>(world_);
          for (size_t i = 0; i < piece; ++i) dst[i] = scratch[i] / n;
        } else {
          std::memcpy(dst, scratch.data(), piece * sizeof(float));
        }
      }
    });
  }

  CommHandle AllReduce(const void* input, void* output, size_t count, CommDataType type,
                       ReduceOp op, const CollectiveOptions& options) override {
    if (type != CommDataType::kFloat32) return Invalid("all-reduce: only fp32 is supported");
    if (count > 0 && (input == nullptr || output == nullptr)) {
      return Invalid("all-reduce: null buffer with count " + std::to_string(count));
    }
    const auto* in = static_cast<const float*>(input);
    auto* out = static_cast<float*>(output);
    if (count > 0 && in != out && Overlaps(in, count * 4, out, count * 4)) {
      return Invalid("all-reduce: input and output overlap without being equal");
    }
    uint64_t bus = 2 * count * 4 * static_cast<uint64_t>(world_ - 1) / world_;
    return Enqueue("all-reduce", options, bus, [=, this](uint32_t tag) {
      if (count == 0) return;
      if (world_ > 1) {
        gloo::AllreduceOptions opts(context_);
        if (in != out) opts.setInput(const_cast<float*>(in), count);
        opts.setOutput(out, count);
        using Fn = void (*)(void*, const void*, const void*, size_t);
        Fn fn = op == ReduceOp::kMax ? static_cast<Fn>(&gloo::max<float>)
                                     : static_cast<Fn>(&gloo::sum<float>);
        opts.setReduceFunction(fn);
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        gloo::allreduce(opts);
      } else if (in != out) {
        std::memcpy(out, in, count * sizeof(float));
      }
      if (op == ReduceOp::kAverage) {
        const float n = static_cast<float>(world_);
        for (size_t i = 0; i < count; ++i) out[i] /= n;
      }
    });
  }

  CommHandle Broadcast(void* buffer, size_t count, CommDataType type, int root,
                       const CollectiveOptions& options) override {
    if (root < 0 || root >= world_) {
      return Invalid("broadcast: root " + std::to_string(root) + " is outside [0, " +
                     std::to_string(world_) + ")");
    }
    size_t bytes = count * CommDataTypeSize(type);
    if (count > 0 && buffer == nullptr) return Invalid("broadcast: null buffer");
    auto* buf = static_cast<uint8_t*>(buffer);
    return Enqueue("broadcast", options, bytes, [=, this](uint32_t tag) {
      if (bytes == 0 || world_ == 1) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(buf, bytes);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  CommHandle Barrier(const CollectiveOptions& options) override {
    return Enqueue("barrier", options, 0, [this](uint32_t tag) {
      if (world_ == 1) return;
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  static bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    auto pa = reinterpret_cast<uintptr_t>(a);
    auto pb = reinterpret_cast<uintptr_t>(b);
    return pa < pb + b_bytes && pb < pa + a_bytes;
  }

  // Invalid arguments fail this rank's handle without touching the network (the other
  // ranks then time out in the matching collective, naming this one as silent).
  static CommHandle Invalid(std::string message) {
    return CommHandle::Completed(Status::InvalidArgument(std::move(message)));
  }

  CommHandle Enqueue(const char* name, const CollectiveOptions& options, uint64_t bytes,
                     std::function<void(uint32_t)> run) {
    auto handle = std::make_shared<GlooHandle>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(
          Op{name, std::string(options.label), bytes, options.after, std::move(run), handle});
    }
    cv_.notify_one();
    return CommHandle(handle);
  }

  void Run() {
    uint32_t tag = 0;
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        op = std::move(queue_.front());
        queue_.pop_front();
        if (stop_) {
          lock.unlock();
          op.handle->Complete(
              Status::Aborted(std::string(op.name) + ": communicator destroyed before it ran"));
          continue;
        }
      }
      ++tag;
      if (!broken_.ok()) {
        op.handle->Complete(Status::Aborted(std::string(op.name) +
                                            ": communicator is unusable after an earlier "
                                            "failure: " +
                                            broken_.ToString()));
        continue;
      }
      Status status;
      if (op.after) status = op.after->Synchronize();
      if (!status.ok()) {
        status.Annotate(std::string(op.name) + ": waiting for the event it must follow");
      }
      auto start = std::chrono::steady_clock::now();
      if (status.ok()) status = RunGloo(op, tag);
      auto end = std::chrono::steady_clock::now();
      if (!status.ok()) broken_ = status;
      std::function<void(const CommOpRecord&)> observer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        observer = observer_;
      }
      if (observer) observer(CommOpRecord{op.name, op.label, start, end, op.bytes, status.ok()});
      op.handle->Complete(std::move(status));
    }
  }

  Status RunGloo(Op& op, uint32_t tag) {
    std::string what;
    try {
      op.run(tag);
      return Status::OK();
    } catch (const gloo::Exception& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    }
    return Failure(op.name, what);
  }

  // Turns a Gloo exception message into a Status naming the lost rank when possible, and
  // reports it through the store so ranks that only saw a timeout can name it too.
  Status Failure(const char* op_name, const std::string& what) {
    std::string msg = CleanGlooMessage(what);
    bool timeout = gloo_internal::LooksLikeTimeout(msg);
    // Reports already in the store come first: once the ranks next to a dead one give up,
    // their own exits look like failures to the rest ("connection reset by rank 3"), so a
    // rank's own reading of its message can blame a survivor; the first reports cannot.
    int reporter = -1;
    // A rank on this host whose process is gone is the surest answer; then what other
    // ranks reported; then the peer this rank's own message names.
    std::optional<int> lost = DeadLocalRank();
    if (!lost) lost = ReportedLostRank(&reporter);
    if (!lost) {
      // A peer that has itself reported a failure is alive and gave up: its closing the
      // connection is a consequence, not the cause.
      std::optional<int> named = gloo_internal::FindRankInMessage(what, endpoints_);
      if (named && !kv_->TryGet("err/" + std::to_string(*named))) lost = named;
    }
    kv_->Set("err/" + std::to_string(rank_), std::to_string(lost ? *lost : -1)).ok();
    if (!lost) {
      // Ranks connected to the dead one report within moments of its death; a rank that
      // timed out has waited far longer than that, so a short look suffices.
      auto deadline = std::chrono::steady_clock::now() +
                      std::min<std::chrono::milliseconds>(timeout_ / 4 + 1ms, 2000ms);
      while (!lost && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(20ms);
        lost = DeadLocalRank();
        if (!lost) lost = ReportedLostRank(&reporter);
      }
    }
    std::string text = std::string(op_name) + " on rank " + std::to_string(rank_) + " of " +
                       std::to_string(world_) + " failed: ";
    if (lost) {
      text += "lost rank " + std::to_string(*lost) + " (" + "host " +
              gloo_internal::ReadableHost(addresses_[*lost]) + ")";
      if (reporter >= 0) text += " as reported by rank " + std::to_string(reporter);
      text += timeout ? " (no data within the comm timeout of " + std::to_string(timeout_.count()) +
                            " ms); "
                      : "; ";
    } else if (timeout) {
      text += "no data from a peer within the comm timeout of " + std::to_string(timeout_.count()) +
              " ms (a rank died, hangs or is slow); ";
    }
    text += msg;
    return timeout ? Status::Timeout(text) : Status::Comm(text);
  }

  // The lowest-numbered other rank on this host whose process has exited without
  // reporting a failure of its own (a rank that reported gave up after a loss; its exit is
  // a consequence), if any.
  std::optional<int> DeadLocalRank() {
    for (int r = 0; r < world_; ++r) {
      if (r != rank_ && gloo_internal::ProcessIsGone(identities_[r]) &&
          !kv_->TryGet("err/" + std::to_string(r))) {
        return r;
      }
    }
    return std::nullopt;
  }

  // The lost rank named by the lowest-numbered other rank that reported one, if any.
  std::optional<int> ReportedLostRank(int* reporter) {
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      std::optional<std::string> v = kv_->TryGet("err/" + std::to_string(r));
      if (!v) continue;
      int l = std::atoi(v->c_str());
      if (l >= 0 && l < world_ && l != rank_) {
        *reporter = r;
        return l;
      }
    }
    return std::nullopt;
  }

  const int rank_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<StoreCore> core_;
  std::shared_ptr<GlooKeyValueStore> kv_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<std::string> addresses_;  // rank r's listening address, "[ip]:port"
  // Every TCP endpoint of rank r (its listening address and the local ends of its
  // connections): Gloo names a peer by whichever end it sees.
  std::vector<std::vector<std::string>> endpoints_;
  // "host pid starttime" of each rank, to check whether ranks on this host are gone.
  std::vector<std::string> identities_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stop_ = false;
  std::function<void(const CommOpRecord&)> observer_;
  Status broken_;  // worker thread only
  std::thread worker_;
};

// The host to listen on: options.hostname, else STRATA_COMM_HOST, else loopback when all
// ranks are on this host, else gethostname(). A name that resolves only to loopback while
// ranks span hosts is refused: Debian maps the host name to 127.0.1.1, and peers would then
// try to reach this rank on their own machine.
Result<std::string> ListenHost(const CommOptions& options) {
  std::string host = options.hostname;
  if (host.empty()) host = EnvGet("STRATA_COMM_HOST");
  const bool one_host = options.rank.local_world_size <= 0 ||
                        options.rank.local_world_size >= options.rank.world_size;
  if (host.empty()) {
    if (one_host) return std::string("127.0.0.1");
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return Status::FromErrno(errno, "gethostname");
    host = buf;
  }
  if (one_host) return host;
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return Status::InvalidArgument("gloo: host '" + host + "' does not resolve (" +
                                   gai_strerror(rc) +
                                   "); set STRATA_COMM_HOST to this host's address");
  }
  bool all_loopback = true;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(a->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) all_loopback = false;
    } else if (a->ai_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(a->ai_addr);
      if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) all_loopback = false;
    }
  }
  ::freeaddrinfo(res);
  if (all_loopback) {
    return Status::InvalidArgument(
        "gloo: host '" + host + "' resolves only to a loopback address, but the " +
        std::to_string(options.rank.world_size) +
        " ranks span hosts (LOCAL_WORLD_SIZE=" + std::to_string(options.rank.local_world_size) +
        "); set STRATA_COMM_HOST to an address of this host the other hosts can reach");
  }
  return host;
}

}  // namespace

void gloo_internal::SetReduceScatterPieceForTesting(size_t elements) {
  g_reduce_scatter_max_elements = elements;
}

Result<std::shared_ptr<KeyValueStore>> OpenKeyValueStore(const RendezvousSpec& spec,
                                                         const std::string& prefix) {
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<StoreCore> core, OpenStoreCore(spec));
  return std::shared_ptr<KeyValueStore>(std::make_shared<GlooKeyValueStore>(core, prefix));
}

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options) {
  const RankInfo& ri = options.rank;
  if (ri.world_size < 1 || ri.rank < 0 || ri.rank >= ri.world_size) {
    return Status::InvalidArgument("gloo communicator: rank " + std::to_string(ri.rank) +
                                   " is outside world size " + std::to_string(ri.world_size));
  }
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return Status::InvalidArgument("gloo communicator: the timeout must be positive");
  }
  // Gloo writes to sockets without MSG_NOSIGNAL: a peer that dies mid-send would kill this
  // process with SIGPIPE instead of failing the collective. Ignore SIGPIPE unless the
  // program installed its own handler.
  {
    struct sigaction current = {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  }
  // Checked first: a host the others cannot reach should fail here, not as a timeout.
  STRATA_ASSIGN_OR_RETURN(std::string hostname, ListenHost(options));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<StoreCore> core, OpenStoreCore(options.rendezvous));
  auto kv = std::make_shared<GlooKeyValueStore>(core, options.store_prefix);
  const std::string where = options.rendezvous.ToString();

  if (ri.world_size == 1) {
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(options, core, kv, nullptr, {std::string()}, {{}}, {std::string()}));
  }

  // Join: every rank announces itself, then waits for all others, so that a missing rank
  // is reported by number rather than as an anonymous store timeout inside Gloo.
  STRATA_RETURN_IF_ERROR(kv->Set("join/" + std::to_string(ri.rank), "1"));
  auto deadline = std::chrono::steady_clock::now() + options.timeout;
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < ri.world_size; ++r) {
      if (!kv->TryGet("join/" + std::to_string(r))) missing.push_back(r);
    }
    if (missing.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      return Status::Timeout("rendezvous " + where + ": rank(s) " + list + " of " +
                             std::to_string(ri.world_size) + " did not join within " +
                             std::to_string(options.timeout.count()) +
                             " ms (not started, crashed, or pointed at another rendezvous)");
    }
    std::this_thread::sleep_for(10ms);
  }

  const std::string gloo_prefix = options.store_prefix + "/gloo";
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::vector<std::string> addresses(ri.world_size);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    std::shared_ptr<gloo::transport::Device> device;
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return Status::InvalidArgument("gloo: cannot listen on host '" + hostname +
                                     "': " + CleanGlooMessage(e.what()) +
                                     " (pass a host name or address of this machine that "
                                     "the other ranks can reach)");
    }
    context = std::make_shared<gloo::rendezvous::Context>(ri.rank, ri.world_size);
    context->setTimeout(options.timeout);
    LockedGlooStore gstore(core, gloo_prefix);
    context->connectFullMesh(gstore, device);
    int peer = (ri.rank + 1) % ri.world_size;
    addresses[ri.rank] =
        gloo_internal::ListenAddressFromPairAddress(context->getPair(peer)->address().str());
  } catch (const std::exception& e) {
    std::string msg = CleanGlooMessage(e.what());
    std::string text = "gloo: connecting rank " + std::to_string(ri.rank) + " of " +
                       std::to_string(ri.world_size) + " through " + where + " failed: " + msg;
    return gloo_internal::LooksLikeTimeout(msg) ? Status::Timeout(text) : Status::Comm(text);
  }

  // Publish and collect every rank's TCP endpoints (listening address first), so failures
  // can name ranks whichever end of a connection Gloo's message shows.
  std::vector<std::vector<std::string>> endpoints(ri.world_size);
  std::vector<std::string> identities(ri.world_size);
  {
    // The accepting side of a connection may still hold it in the kernel's backlog when
    // connectFullMesh returns; wait (briefly) until every peer's socket is in our table.
    std::vector<std::string> local;
    auto until = std::chrono::steady_clock::now() +
                 std::min<std::chrono::milliseconds>(options.timeout, 5000ms);
    for (;;) {
      int established = 0;
      local = gloo_internal::LocalTcpEndpoints(&established);
      if (established >= ri.world_size - 1 || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(2ms);
    }
    // Each pair has its own address, the one its peer got through the rendezvous and
    // names in error messages; these come first.
    std::string mine = addresses[ri.rank];
    for (int r = 0; r < ri.world_size; ++r) {
      if (r == ri.rank) continue;
      std::string a =
          gloo_internal::ListenAddressFromPairAddress(context->getPair(r)->address().str());
      if (a != addresses[ri.rank]) mine += " " + a;
    }
    for (const std::string& e : local) {
      if (e != addresses[ri.rank]) mine += " " + e;
    }
    STRATA_RETURN_IF_ERROR(kv->Set("addr/" + std::to_string(ri.rank), mine));
    STRATA_RETURN_IF_ERROR(
        kv->Set("proc/" + std::to_string(ri.rank), gloo_internal::ProcessIdentity()));
  }
  for (int r = 0; r < ri.world_size; ++r) {
    Result<std::string> proc = kv->Get("proc/" + std::to_string(r), options.timeout);
    if (proc.ok()) identities[r] = *proc;
    Result<std::string> a = kv->Get("addr/" + std::to_string(r), options.timeout);
    if (!a.ok()) {
      Status s = a.status();
      return s.Annotate("gloo: collecting rank " + std::to_string(r) + "'s addresses");
    }
    std::istringstream in(*a);
    for (std::string e; in >> e;) endpoints[r].push_back(e);
    if (!endpoints[r].empty()) addresses[r] = endpoints[r][0];
  }
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(options, core, kv, std::move(context), std::move(addresses),
                           std::move(endpoints), std::move(identities)));
}

}  // namespace strata
